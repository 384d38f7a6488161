"""Verify: ``ag.verify`` and ``autograd-groups verify``, which check each rule that fired against
the limits of the automatic derivative at nearby points (documentation: "Checking rules"), and the
check of a call site behind ``SecondOrderWarning``, installed here into the rule sites below
(sites/second_order.py)."""

from ..sites import second_order
from .site_check import check_site

second_order.set_checker(check_site)

"""Verify: ``ag.verify`` and ``autograd-groups verify``, which check each rule that fired against the
limits of the automatic derivative at nearby points (documentation: "Checking rules"), and the check
of a call site behind ``SecondOrderWarning`` and ``FirstOrderWarning``, installed here into the rule
sites below (sites/second_order.py, sites/first_order.py)."""

from ..sites import first_order, second_order
from .site_check import check_first_order, check_site

second_order.set_checker(check_site)
first_order.set_checker(check_first_order)

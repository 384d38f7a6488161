"""Errors name what went wrong, where, and how to fix it; never a silent NaN or wrong gradient."""

from __future__ import annotations

import re

import pytest
import torch

import autograd_groups as ag


def test_unknown_op_names_it_and_the_closest_known_ops():
    with pytest.raises(ag.RuleError, match=re.escape("unknown op 'sqr': autograd has no backward node "
                                                     "for it; did you mean sqrt, rsqrt?")):
        ag.Subgradient(op="sqr", when="result == 0", grad=0)


def test_when_naming_a_value_the_op_does_not_save_lists_what_it_saves():
    with pytest.raises(ag.RuleError, match=re.escape(
            "when of the sqrt rule names 'self', which sqrt does not save; it saves result")):
        ag.Subgradient(op="sqrt", when="self == 0", grad=0)
    with pytest.raises(ag.RuleError, match=re.escape(
            "grad of the clamp_min rule names 'other', which clamp_min does not save; "
            "it saves min, self")):
        ag.Subgradient(op="clamp_min", when=lambda self: self == 0, grad=lambda other: other)


def test_malformed_expression_gives_its_column():
    with pytest.raises(ag.ExpressionError, match=r"'when' of the sqrt rule: attribute access") as info:
        ag.Subgradient(op="sqrt", when="result.__class__ == 0")
    assert info.value.col == 1
    with pytest.raises(ag.ExpressionError, match="unknown function 'open'"):
        ag.Subgradient(op="sqrt", when="result == 0", grad="open(1)")


def run_sqrt_group(name: str, rule: ag.Subgradient) -> None:
    ag.register_rule(name, rule)
    x = torch.zeros(3, 4, requires_grad=True)
    ag.autograd_group(name)(lambda x: x.sqrt())(x).sum().backward()


def test_rule_returning_the_wrong_shape_fails_at_backward_naming_group_and_rule():
    rule = ag.Subgradient(op="sqrt", when="result == 0", grad=lambda result: torch.zeros(5))
    with pytest.raises(ag.RuleError, match=re.escape(
            "rule subgradient(sqrt: result == 0 -> <lambda>), at op sqrt: 'grad' gave a value of shape "
            "(5,), but the gradient of input 0 it replaces has shape (3, 4)")) as info:
        run_sqrt_group("wrong_shape", rule)
    assert str(info.value).startswith("group 'wrong_shape' (created at ")
    assert "test_errors.py:" in str(info.value)


def test_when_must_give_a_bool_tensor():
    rule = ag.Subgradient(op="sqrt", when=lambda result: result, grad=0)
    with pytest.raises(ag.RuleError, match=r"'when' must give a bool tensor, not a tensor of dtype "
                                           r"torch.float32"):
        run_sqrt_group("not_bool", rule)


def test_when_with_the_wrong_shape_fails():
    rule = ag.Subgradient(op="sqrt", when=lambda result: torch.ones(7, dtype=torch.bool), grad=0)
    with pytest.raises(ag.RuleError, match=re.escape("'when' gave a mask of shape (7,), but the gradient "
                                                     "of input 0 it replaces has shape (3, 4)")):
        run_sqrt_group("mask_shape", rule)


def test_a_rule_that_raises_is_reported_with_its_group():
    def broken(result):
        raise ValueError("boom")

    with pytest.raises(ag.RuleError, match=r"group 'raises' .*'when' raised ValueError\('boom'\)"):
        run_sqrt_group("raises", ag.Subgradient(op="sqrt", when=broken, grad=0))


def test_conflicting_and_duplicate_registrations():
    rule = ag.Subgradient(op="sqrt", when="result == 0", grad=0)
    assert ag.register_rule("g", rule) is rule
    assert ag.register_rule("g", rule) is rule
    with pytest.raises(ag.RuleError, match="same op and condition, but a different grad"):
        ag.register_rule("g", ag.Subgradient(op="sqrt", when="result == 0", grad=1))
    safe = ag.register_rule("g", ag.NanSafe())
    assert ag.register_rule("g", ag.NanSafe()) is safe
    with pytest.raises(ag.RuleError, match="a group has one nan_safe rule"):
        ag.register_rule("g", ag.NanSafe(doc="another"))
    assert ag.list_rules()["g"] == (rule, safe)


def test_bad_registrations_are_refused():
    with pytest.raises(ag.RuleError, match="is not a rule"):
        ag.register_rule("g", "sqrt")  # type: ignore[arg-type]
    with pytest.raises(ag.RuleError, match="a group name must be a non-empty string"):
        ag.register_rule("", ag.NanSafe())
    with pytest.raises(ag.GroupError, match="a group name must be a non-empty string"):
        ag.autograd_group(3)  # type: ignore[arg-type]
    with pytest.raises(ag.RuleError, match="group 'g' has no rule nan_safe"):
        ag.unregister_rule("g", ag.NanSafe())


def test_groups_closed_out_of_order():
    outer, inner = ag.autograd_group("a"), ag.autograd_group("b")
    x = torch.ones(1, requires_grad=True)
    with ag.trace():
        outer.__enter__()
        inner.__enter__()
        x * 2
        with pytest.raises(ag.GroupError, match="group 'a' was closed out of order"):
            outer.__exit__(None, None, None)
        inner.__exit__(None, None, None)
        outer.__exit__(None, None, None)

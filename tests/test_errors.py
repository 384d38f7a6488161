"""Errors name what went wrong, where, and how to fix it; never a silent NaN or wrong gradient."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autograd_groups as ag
from autograd_groups.errors import InternalError


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


def test_a_saved_value_autograd_did_not_keep_is_an_error_not_a_rule_that_never_fires():
    # MulBackward0 keeps x only for y's gradient; with y constant the rule reading it would read
    # None, and (None == 0) is False: the rule would silently never fire.
    with ag.registry_scope():
        ag.register_rule("unkept", ag.Subgradient(op="mul", input=0, when="self == 0", grad=0))
        x = torch.zeros(3, requires_grad=True)
        out = ag.autograd_group("unkept")(lambda x, y: x * y)(x, torch.ones(3))
        with pytest.raises(ag.RuleError, match=re.escape(
                "at op mul: this MulBackward0 node did not keep 'self': autograd saves a value only "
                "for the gradients it computes")):
            out.sum().backward()


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
        ag.register_rule("g", ag.Subgradient(op="sqrt", when="result == 0", grad="grad * 1"))
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


# Elementwise means elementwise: a mask or value that broadcasts onto the gradient is an error.

def norm_rows(name: str, rule: ag.Subgradient) -> torch.Tensor:
    ag.register_rule(name, rule)
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True)
    ag.autograd_group(name)(lambda x: x.pow(2).sum(-1).sqrt())(x).sum().backward()
    return x.grad


@pytest.mark.parametrize(("when", "shape"), [
    (lambda result: (result == 0).any(), "()"),
    (lambda result: (result == 0)[:1], "(1,)"),
])
def test_a_mask_that_broadcasts_onto_the_gradient_is_refused(when, shape):
    with pytest.raises(ag.RuleError) as info:
        norm_rows("any_zero", ag.Subgradient(op="sqrt", when=when, grad=0))
    message = str(info.value)
    assert message.startswith("group 'any_zero' (created at ")
    assert (f"rule subgradient(sqrt: <lambda> -> 0), at op sqrt: 'when' gave a mask of shape {shape}, "
            f"but the gradient of input 0 it replaces has shape (2,)") in message
    assert "use an override rule (@ag.special_case('any_zero'))" in message


def test_an_elementwise_mask_gives_the_right_gradient_row_by_row():
    grad = norm_rows("rows", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    reference = torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True)
    torch.linalg.vector_norm(reference, dim=-1).sum().backward()
    torch.testing.assert_close(grad, reference.grad)
    torch.testing.assert_close(grad[1], torch.tensor([0.6, 0.8]))


def test_a_value_that_broadcasts_onto_the_gradient_is_refused():
    rule = ag.Subgradient(op="sqrt", when="result == 0", grad=lambda result: result.sum())
    with pytest.raises(ag.RuleError, match=re.escape("'grad' gave a value of shape (), but the gradient of "
                                                     "input 0 it replaces has shape (2,)")):
        norm_rows("summed", rule)


def test_a_mask_of_an_input_the_op_broadcast_applies_along_the_broadcast():
    # a (2, 1) * b (2, 3): the op broadcast a along dim 1, so a mask over a fits b's gradient too.
    ag.register_rule("scaled", ag.Subgradient(op="mul", when="self == 0", grad=0))
    a = torch.tensor([[0.0], [2.0]], requires_grad=True)
    b = torch.arange(6.0).reshape(2, 3).requires_grad_()
    ag.autograd_group("scaled")(lambda a, b: a * b)(a, b).sum().backward()
    a_plain, b_plain = a.detach().requires_grad_(), b.detach().requires_grad_()
    (a_plain * b_plain).sum().backward()
    keep = (a.detach() != 0).to(a.dtype)
    torch.testing.assert_close(a.grad, a_plain.grad * keep)
    torch.testing.assert_close(b.grad, b_plain.grad * keep)
    assert torch.equal(b.grad, torch.tensor([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]]))


def test_a_mask_over_the_output_does_not_fit_a_broadcast_input():
    ag.register_rule("wide", ag.Subgradient(op="mul", when="grad == 0", grad=0, input=0))
    a = torch.ones(2, 1, requires_grad=True)
    b = torch.ones(2, 3, requires_grad=True)
    with pytest.raises(ag.RuleError, match=re.escape("'when' gave a mask of shape (2, 3), but the gradient "
                                                     "of input 0 it replaces has shape (2, 1)")):
        ag.autograd_group("wide")(lambda a, b: a * b)(a, b).sum().backward()


# What can be known at registration is checked there.

def test_an_input_the_op_does_not_have_is_refused_at_registration():
    with pytest.raises(ag.RuleError, match=re.escape(
            "the sqrt rule: input 3 is out of range: sqrt has 1 input (position 0, in the order of "
            "next_functions)")):
        ag.Subgradient(op="sqrt", when="result == 0", grad=0, input=3)
    with pytest.raises(ag.RuleError, match=re.escape("pow has 2 inputs (positions 0 to 1")):
        ag.Subgradient(op="pow", when="self == 0", grad=0, input=2)
    assert ag.Subgradient(op="pow", when="self == 0", grad=0, input=1).input == 1


@pytest.mark.parametrize(("when", "message"), [
    (1, "is the constant 1: it reads none of the op's values"),
    (True, "is the constant True: it reads none of the op's values"),
    ("True", "is the constant True: it reads none of the op's values"),
    ("1 == 1", "is the constant 1 == 1: it reads none of the op's values"),
    ("result", "must be an elementwise condition (a comparison such as 'result == 0', combined with &, | "
               "and ~), not a saved value ('result')"),
    ("result * 2", "must be an elementwise condition (a comparison such as 'result == 0', combined with "
                   "&, | and ~), not a number ('result * 2')"),
    ("where(result == 0, grad, result)", "not a number ('where(result == 0, grad, result)')"),
])
def test_a_when_that_cannot_be_a_condition_is_refused_at_registration(when, message):
    with pytest.raises(ag.RuleError, match="^'when' of the sqrt rule .*" + re.escape(message)):
        ag.Subgradient(op="sqrt", when=when, grad=0)


@pytest.mark.parametrize("when", ["result == 0", "~(result > 0)", "isnan(grad) | (result <= 1e-30)",
                                  "where(grad == 0, result == 0, result < 0)"])
def test_conditions_are_accepted(when):
    assert ag.Subgradient(op="sqrt", when=when, grad=0).when == when


# -- errors that name the fix (the issue on trust, item 8) ---------------------------------------


def test_an_op_given_as_a_function_asks_for_its_name():
    with pytest.raises(ag.RuleError, match=re.escape("a subgradient's op is the op's name, a string, not "
                                                     "<built-in method sqrt") + r".*: write op='sqrt'"):
        ag.Subgradient(op=torch.sqrt, when="result == 0")  # type: ignore[arg-type]


def test_an_op_given_as_its_node_name_says_did_you_mean():
    with pytest.raises(ag.RuleError, match=re.escape("'SqrtBackward0' is the name of an autograd node (as "
                                                     "anomaly mode and grad_fn show it), not of an op: did "
                                                     "you mean 'sqrt'?")):
        ag.Subgradient(op="SqrtBackward0", when="result == 0")


def _override_group(name, backward, outputs=1):
    @ag.special_case(name)
    def fires(ctx):
        return True

    fires.backward(backward)
    return ag.autograd_group(name)(lambda x: (x.sin(), x.cos()) if outputs == 2 else x.sin())


def test_a_replacement_without_one_gradient_parameter_per_output_says_so():
    with ag.registry_scope():
        polar = _override_group("err.arity", lambda ctx, grad: torch.zeros_like(ctx.inputs[0]), outputs=2)
        a, b = polar(torch.ones(2, requires_grad=True))
        with pytest.raises(ag.RuleError, match=r"group 'err.arity' .* rule override\(fires\): the "
                                               r"replacement backward <lambda> does not take \(ctx, grad_0, "
                                               r"grad_1\): it needs one gradient parameter per group output, "
                                               r"and the group has 2 outputs"):
            (a + b).sum().backward()


def test_a_replacement_that_returns_a_number_is_told_to_return_tensors():
    with ag.registry_scope():
        sin = _override_group("err.int", lambda ctx, grad: 0)
        with pytest.raises(ag.RuleError, match=r"group 'err.int' .* the replacement backward returned int 0 "
                                               r"as gradient 0: return tensors"):
            sin(torch.ones(2, requires_grad=True)).sum().backward()


def test_vmap_over_grad_of_an_override_with_a_bool_check_names_the_group_and_the_fix():
    with ag.registry_scope():
        @ag.special_case("err.vmap")
        def has_zero(ctx):
            return bool((ctx.outputs[0] == 0).any())

        @has_zero.backward
        def zero(ctx, grad):
            return torch.zeros_like(ctx.inputs[0])

        norm = ag.autograd_group("err.vmap")(lambda x: (x * x).sum().sqrt())
        with pytest.raises(ag.RuleError) as caught:
            torch.func.vmap(torch.func.grad(norm))(torch.zeros(2, 3))
    message = str(caught.value)
    assert "group 'err.vmap'" in message and "declare the check `-> torch.Tensor`" in message
    assert "forward-mode" not in message and "forward mode" not in message


@pytest.mark.slow
def test_fullgraph_compile_of_an_override_with_a_bool_check_names_the_group_and_the_fix():
    with ag.registry_scope():
        @ag.special_case("err.compile")
        def has_zero(ctx):
            return bool((ctx.outputs[0] == 0).any())

        @has_zero.backward
        def zero(ctx, grad):
            return torch.zeros_like(ctx.inputs[0])

        norm = ag.autograd_group("err.compile")(lambda x: (x * x).sum(-1).sqrt())
        try:
            with pytest.raises(Exception) as caught:
                torch.compile(lambda x: norm(x).sum(), fullgraph=True)(torch.zeros(2, 3, requires_grad=True))
        finally:
            torch._dynamo.reset()
    message = str(caught.value)
    assert "group 'err.compile' has an override whose check is not declared to return a tensor" in message
    assert "declare the check `-> torch.Tensor` and return a bool tensor" in message
    assert "file an issue" not in message.lower()


#: Modules rewritten elsewhere, whose asserts go with that rewrite.
def test_library_code_has_no_bare_assert() -> None:
    # python -O strips assert statements: a broken guarantee must raise internal_error instead.
    package = Path(ag.__file__).parent
    found = sorted(f"{path.relative_to(package)}:{node.lineno}" for path in package.rglob("*.py")
                   for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assert))
    assert found == []


def test_an_internal_error_says_it_is_a_bug_of_the_library_even_under_python_O() -> None:
    # A check the expression language's parser makes unreachable, reached directly: the Subscript
    # node never passes _compile, so _describe meets a node it does not know.
    code = ("import ast\nfrom autograd_groups.rules import expr\n"
            "expr._describe(ast.parse('x[0]', mode='eval').body)\n")
    run = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(ag.__file__).parents[1])})
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("autograd_groups.errors.InternalError: autograd-groups internal error: a "
                           "validated expression holds a Subscript node. This is a bug of "
                           "autograd-groups, not of your code: please report it"), last
    assert issubclass(InternalError, ag.GroupError)

"""The registry: ordered, introspectable, thread-safe, undoable."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch

import autograd_groups as ag
from autograd_groups.rules import registry
from conftest import line_of


def test_rules_are_listed_in_registration_order():
    rules = [ag.Subgradient(op="sqrt", when="result == 0", grad=0), ag.NanSafe(),
             ag.Subgradient(op="log", when="self == 0", grad=0)]
    for rule in rules:
        ag.register_rule("g", rule)
    assert ag.list_rules()["g"] == tuple(rules)
    ag.unregister_rule("g", rules[1])
    assert ag.list_rules()["g"] == (rules[0], rules[2])


def test_registry_scope_undoes_registrations():
    with ag.registry_scope():
        ag.register_rule("temporary", ag.NanSafe())
        assert "temporary" in ag.list_rules()
    assert "temporary" not in ag.list_rules()


def test_the_builtins_outlive_the_scope_of_their_first_use():
    # The suite loads the built-ins before any test: their first use inside a scope needs a fresh
    # process.
    script = (
        "import torch, autograd_groups as ag\n"
        "with ag.registry_scope():\n"
        "    ag.ops.cdist(torch.zeros(1, 2), torch.zeros(1, 2))\n"
        "x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True)\n"
        "ag.ops.cdist(x, x).sum().backward()\n"
        "print('ops.cdist' in ag.list_rules(), x.grad.tolist())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True)
    torch.cdist(x, x).sum().backward()
    assert done.stdout.split(" ", 1) == ["True", f"{x.grad.tolist()}\n"]


def test_kept_rules_outlive_every_open_scope():
    # Without the test's own scope (conftest's) among the open ones while it runs: the kept rule
    # would outlive that one too, and every later test of the worker would see it.
    outer = registry._open_scopes[:]
    registry._open_scopes.clear()
    try:
        rule = ag.NanSafe()
        with ag.registry_scope():
            with ag.registry_scope():
                ag.register_rule("kept", rule)
                ag.register_rule("dropped", ag.NanSafe())
                registry.keep(["kept"])
            assert "dropped" not in ag.list_rules()
        assert ag.list_rules()["kept"] == (rule,)
        ag.unregister_rule("kept", rule)
    finally:
        registry._open_scopes[:] = outer


def test_registering_while_another_thread_runs_backward(cdist_example):
    failures: list[BaseException] = []
    stop = threading.Event()
    x1 = torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float64)

    def train():
        try:
            while not stop.is_set():
                a = x1.clone().requires_grad_()
                cdist_example.grouped_cdist(a, x1.clone()).sum().backward()
                assert torch.isfinite(a.grad).all()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)

    def register(offset: int):
        for k in range(100):
            ag.register_rule("stress", ag.Subgradient(op="sqrt", when=f"result == {offset + k}"))

    trainer = threading.Thread(target=train)
    trainer.start()
    writers = [threading.Thread(target=register, args=(1000 * w,)) for w in range(3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    trainer.join()
    assert failures == []
    assert len(ag.list_rules()["stress"]) == 300


# Conflicts by meaning; a notebook cell may run twice.

@pytest.mark.parametrize("spelling", ["result==0", "0 == result", "(result == 0)", "result == 0.0",
                                      "((result) == (0))"])
def test_the_same_condition_spelled_differently_conflicts_naming_both_and_where(spelling):
    first = ag.register_rule("g", ag.Subgradient(op="sqrt", when="result == 0", grad="grad*1"))  # first-rule
    with pytest.raises(ag.RuleError) as info:
        ag.register_rule("g", ag.Subgradient(op="sqrt", when=spelling, grad="grad * 2"))  # second-rule
    message = str(info.value)
    first_line, second_line = line_of(__file__, "# first-rule"), line_of(__file__, "# second-rule")
    assert message.startswith(f"group 'g': subgradient(sqrt: {spelling} -> grad * 2) (from {__file__}:"
                              f"{second_line}) conflicts with subgradient(sqrt: result == 0 -> grad*1) "
                              f"(registered at {__file__}:{first_line}): same op and condition, but a "
                              f"different grad.")
    assert "pass replace=True" in message
    assert ag.list_rules()["g"] == (first,)


def test_running_a_registration_again_is_a_no_op():
    before = registry.generation()
    for _ in range(2):  # a notebook cell, run twice
        rule = ag.register_rule("g", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
        ag.register_rule("g", ag.NanSafe())
    (registered, nan_safe) = ag.list_rules()["g"]
    assert rule is registered and isinstance(nan_safe, ag.NanSafe)
    generation = registry.generation()
    assert generation > before
    assert ag.register_rule("g", ag.Subgradient(op="sqrt", when="0==result", grad=0.0)) is registered
    assert registry.generation() == generation  # nothing changed: compiled code need not recompile


def test_callables_are_the_same_rule_only_when_they_are_the_same_object():
    def at_zero(result):
        return result == 0

    rule = ag.register_rule("g", ag.Subgradient(op="sqrt", when=at_zero, grad=0))
    assert ag.register_rule("g", ag.Subgradient(op="sqrt", when=at_zero, grad=0)) is rule
    with pytest.raises(ag.RuleError, match="conflicts with"):
        ag.register_rule("g", ag.Subgradient(op="sqrt", when=at_zero, grad=lambda grad: grad * 0))
    other = ag.register_rule("g", ag.Subgradient(op="sqrt", when=lambda result: result == 0, grad=0))
    assert ag.list_rules()["g"] == (rule, other)  # another condition, as far as anyone can tell


def test_replace_swaps_a_conflicting_rule_in_place():
    ag.register_rule("g", ag.Subgradient(op="sqrt", when="result == 0", grad="grad * 1"))
    safe = ag.register_rule("g", ag.NanSafe())
    new = ag.register_rule("g", ag.Subgradient(op="sqrt", when="0 == result", grad=0), replace=True)
    assert ag.list_rules()["g"] == (new, safe)
    x = torch.zeros(2, requires_grad=True)
    ag.autograd_group("g")(lambda x: x.sqrt())(x).sum().backward()
    assert torch.equal(x.grad, torch.zeros(2))


def test_different_conditions_and_inputs_do_not_conflict():
    rules = [ag.Subgradient(op="pow", when="self == 0", grad=0, input=0),
             ag.Subgradient(op="pow", when="self == 0", grad="grad * 1", input=1),
             ag.Subgradient(op="pow", when="self < 0", grad=0)]
    assert [ag.register_rule("g", r) for r in rules] == rules
    with pytest.raises(ag.RuleError, match="same op and condition, but a different grad and input"):
        ag.register_rule("g", ag.Subgradient(op="pow", when="0 == self", grad="grad * 2"))

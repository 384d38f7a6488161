"""Rules are compared by meaning: random conditions, rewritten by reordering the operands of
``== != & | + *``, flipping ``<``, regrouping ``&``/``|`` chains, adding parentheses, re-spacing and
writing numbers as floats, are the same rule; conditions that Python's own ``eval`` tells apart are
different rules."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd_groups as ag
from autograd_groups.rules.expr import condition_problem, parse

SETTINGS = {"deadline": None, "derandomize": True, "database": None, "max_examples": 300}

# A tree: ("name", str) | ("num", int) | (arith, left, right) | (compare, left, right)
#         | ("&" or "|", [children]) | ("~", child)
Tree = tuple[Any, ...]
COMMUTATIVE = {"==", "!=", "+", "*"}
FLIPPED = {"<": ">", "<=": ">="}

terms = st.recursive(
    st.one_of(st.tuples(st.just("name"), st.sampled_from(["result", "grad"])),
              st.tuples(st.just("num"), st.integers(0, 3))),
    lambda inner: st.tuples(st.sampled_from(["+", "*", "-"]), inner, inner),
    max_leaves=3)
comparisons = st.tuples(st.sampled_from(["==", "!=", "<", "<="]), terms, terms)
conditions = st.recursive(
    comparisons,
    lambda inner: st.one_of(st.tuples(st.sampled_from(["&", "|"]), st.lists(inner, min_size=2, max_size=3)),
                            st.tuples(st.just("~"), inner)),
    max_leaves=4)


def usable(tree: Tree) -> bool:
    """Whether ``tree`` is a condition a rule may have: it reads a value and can hold somewhere."""
    return bool(names(tree)) and condition_problem(parse(render(tree, None))) is None


def names(tree: Tree) -> set[str]:
    found: set[str] = set()
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if node[0] == "name":
            found.add(node[1])
        elif node[0] in ("&", "|"):
            stack.extend(node[1])
        elif node[0] != "num":
            stack.extend(node[1:])
    return found


def render(tree: Tree, rng: random.Random | None) -> str:
    """Python source of ``tree``; with ``rng``, the same condition spelled at random."""
    def space() -> str:
        return rng.choice(["", " ", "  "]) if rng else " "

    def wrap(text: str) -> str:
        return f"({space()}{text}{space()})" if rng and rng.random() < 0.3 else text

    kind = tree[0]
    if kind == "name":
        return wrap(tree[1])
    if kind == "num":
        return wrap(f"{tree[1]}.0" if rng and rng.random() < 0.5 else str(tree[1]))
    if kind == "~":
        return wrap(f"~({render(tree[1], rng)})")
    if kind in ("&", "|"):
        parts = [f"({render(child, rng)})" for child in tree[1]]
        if rng:
            rng.shuffle(parts)
        text = parts[0]
        for part in parts[1:]:  # grouped to the left, or at random to the right
            text = f"{text}{space()}{kind}{space()}{part}" if not rng or rng.random() < 0.5 \
                else f"{part}{space()}{kind}{space()}({text})"
        return wrap(text)
    op, left, right = kind, f"({render(tree[1], rng)})", f"({render(tree[2], rng)})"
    if rng and op in COMMUTATIVE and rng.random() < 0.5:
        left, right = right, left
    if rng and op in FLIPPED and rng.random() < 0.5:
        op, left, right = FLIPPED[op], right, left
    return wrap(f"{left}{space()}{op}{space()}{right}")


SAMPLES = [{"result": torch.tensor([0.0, 1.0, 2.0, 3.0, 0.5, 1.0]),
            "grad": torch.tensor([0.0, 2.0, 1.0, 3.0, -1.0, 1.0])},
           {"result": torch.tensor([2.0, 0.0, 3.0, 1.0, 1.0, 4.0]),
            "grad": torch.tensor([1.0, 0.0, 0.0, -2.0, 3.0, 2.0])}]


def truth(source: str) -> list[torch.Tensor]:
    """What Python itself computes for ``source`` (the sources are the test's own)."""
    return [torch.as_tensor(eval(source, {}, dict(sample))) for sample in SAMPLES]


@settings(**SETTINGS)
@given(conditions.filter(usable), st.randoms(use_true_random=False))
def test_equivalent_spellings_are_the_same_rule(tree: Tree, rng: random.Random) -> None:
    plain, respelled = render(tree, None), render(tree, rng)
    assert all(torch.equal(a, b) for a, b in zip(truth(plain), truth(respelled)))  # the generator is right
    with ag.registry_scope():
        first = ag.register_rule("g", ag.Subgradient(op="sqrt", when=plain, grad=0))
        assert ag.register_rule("g", ag.Subgradient(op="sqrt", when=respelled, grad=0.0)) is first
        with pytest.raises(ag.RuleError, match="same op and condition, but a different grad"):
            ag.register_rule("g", ag.Subgradient(op="sqrt", when=respelled, grad="grad * 1"))


@settings(**SETTINGS)
@given(conditions.filter(usable), conditions.filter(usable))
def test_conditions_that_compute_differently_are_different_rules(a: Tree, b: Tree) -> None:
    first, second = render(a, None), render(b, None)
    if all(torch.equal(x, y) for x, y in zip(truth(first), truth(second))):
        return  # no sample tells them apart: they may well mean the same
    with ag.registry_scope():
        rules = [ag.Subgradient(op="sqrt", when=first, grad=0),
                 ag.Subgradient(op="sqrt", when=second, grad="grad * 1")]
        assert [ag.register_rule("g", r) for r in rules] == rules

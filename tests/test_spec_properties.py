"""Whatever the text, loading a spec either works or raises SpecError: never another exception.

Three sources of input, 2,100 cases in all: spec-shaped YAML documents built from the format's own
vocabulary (then optionally damaged by one edit), arbitrary text, and arbitrary expression strings
put into ``when`` and ``grad``. Imports are off, so no generated ``module:function`` is ever imported.
"""

from __future__ import annotations

import string

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autograd_groups as ag
from autograd_groups.rules import expr

KEYS = ["name", "doc", "special_cases", "subgradient", "nan_safe", "override", "op", "when", "grad",
        "input", "check", "backward"]
WORDS = ["g(Tensor x) -> Tensor", "cdist(Tensor x1, Tensor x2) -> Tensor", "f()", "sqrt", "pow", "mul",
         "clamp_min", "result == 0", "self == 0", "grad", "where(result == 0, 0, grad)", "math:sqrt",
         "os:system", "(", "Tensor", "->", "true", ""]
EXPRESSION_CHARS = string.ascii_letters[:12] + string.digits + "_ ()[]{}.,:;'\"=<>!&|~^%@*/+-#\\\n\t"
EXPRESSION_WORDS = ["result", "self", "grad", "other", "exponent", "==", "!=", "&", "|", "~", "where(",
                    "abs(", "zeros_like(", "finfo_eps(", "__import__", "__class__", ".", "lambda", "for",
                    "in", "if", "else", "(", ")", ",", "0", "1e309", "**", "9", "inf", "nan", " "]

SETTINGS = {"deadline": None, "derandomize": True, "database": None,
            "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


def load_only_spec_error(text: str) -> None:
    """Load ``text`` as YAML text (a str with a newline), undo it; let only SpecError through."""
    with ag.registry_scope():
        try:
            handle = ag.load_spec(text + "\n", allow_imports=False)
        except ag.SpecError as e:
            assert e.errors and all(isinstance(line, int) and isinstance(col, int) and message
                                    for _, line, col, message in e.errors)
        else:
            handle.unload()


scalars = st.one_of(st.sampled_from(WORDS), st.text(max_size=12), st.integers(-3, 5), st.floats(),
                    st.booleans(), st.none())
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=5)), max_leaves=25)
rules = st.one_of(
    st.fixed_dictionaries({"subgradient": st.fixed_dictionaries(
        {"op": st.sampled_from(["sqrt", "pow", "clamp_min", "sqr"])},
        optional={"when": values, "grad": values, "input": values, "doc": values})}),
    st.fixed_dictionaries({"nan_safe": st.one_of(st.just(True), values)}),
    st.fixed_dictionaries({"override": st.fixed_dictionaries({}, optional={"check": values,
                                                                           "backward": values})}),
    values)
groups = st.fixed_dictionaries({"name": st.one_of(st.sampled_from(WORDS), values)},
                                optional={"doc": values, "special_cases": st.lists(rules, max_size=4)})
documents = st.one_of(st.lists(groups, max_size=4), values).map(
    lambda doc: yaml.safe_dump(doc, default_flow_style=None, allow_unicode=True))


@st.composite
def damaged(draw: st.DrawFn, text: str) -> str:
    """``text`` with one character inserted, deleted or replaced (or left alone)."""
    i = draw(st.integers(0, len(text)))
    edit = draw(st.sampled_from(["keep", "insert", "delete", "replace"]))
    char = draw(st.sampled_from(list(":-[]{}&*!|>'\"#%@` \t\n") + ["\x00", "\x85", "é"]))
    if edit == "insert":
        return text[:i] + char + text[i:]
    if edit == "delete":
        return text[:i] + text[i + 1:]
    return text[:i] + char + text[i + 1:] if edit == "replace" else text


def test_spec_shaped_documents_raise_only_spec_error() -> None:
    seen = []

    @settings(max_examples=900, **SETTINGS)
    @given(documents.flatmap(damaged))
    def run(text: str) -> None:
        seen.append(text)
        load_only_spec_error(text)

    run()
    assert len(seen) >= 900


def test_arbitrary_text_raises_only_spec_error() -> None:
    seen = []

    @settings(max_examples=400, **SETTINGS)
    @given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
    def run(text: str) -> None:
        seen.append(text)
        load_only_spec_error(text)

    run()
    assert len(seen) >= 400


expressions = st.one_of(st.text(alphabet=EXPRESSION_CHARS, max_size=40),
                        st.lists(st.sampled_from(EXPRESSION_WORDS), max_size=14).map("".join))


def test_arbitrary_expressions_raise_only_spec_error() -> None:
    seen = []

    @settings(max_examples=800, **SETTINGS)
    @given(expressions, expressions, st.sampled_from(["sqrt", "pow", "clamp_min"]), st.booleans())
    def run(when: str, grad: str, op: str, quoted: bool) -> None:
        seen.append(when)
        try:
            expr.parse(when)
        except ag.ExpressionError as e:
            assert e.col >= 1
        rule = {"op": op, "when": when, "grad": grad}
        if quoted:
            group = {"name": "g(Tensor x) -> Tensor", "special_cases": [{"subgradient": rule}]}
            body = yaml.safe_dump([group])
        else:
            body = f"- name: g(Tensor x)\n  special_cases:\n    - subgradient: {{op: {op}, when: {when}}}\n"
        load_only_spec_error(body)

    run()
    assert len(seen) >= 800

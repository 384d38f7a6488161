"""Every kind of spec error: SpecError, at the right file:line:column, with a message that helps.

Expected columns are found in the spec text of the test itself (``at``), never from the code under
test.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import autograd_groups as ag

SENTINEL = "ag_spec_escape_sentinel"


def at(spec: str, line: int, needle: str) -> tuple[int, int]:
    """1-based (line, column) of the first ``needle`` on 1-based ``line`` of ``spec``."""
    text = spec.splitlines()[line - 1]
    assert needle in text, (needle, text)
    return line, text.index(needle) + 1


def errors(spec: str, **kwargs: bool) -> list[tuple[str, int, int, str]]:
    with pytest.raises(ag.SpecError) as info:
        ag.load_spec(spec, **kwargs)
    assert all(type(e) is tuple and len(e) == 4 for e in info.value.errors)
    return info.value.errors


def one_error(spec: str, **kwargs: bool) -> tuple[int, int, str]:
    found = errors(spec, **kwargs)
    assert len(found) == 1, found
    file, line, col, message = found[0]
    assert file == "<string>"
    return line, col, message


def subgradient(when: str, op: str = "sqrt", extra: str = "") -> str:
    return (f"- name: g(Tensor x) -> Tensor\n  special_cases:\n"
            f"    - subgradient: {{op: {op}, when: {when}{extra}}}\n")


def test_yaml_syntax_error_is_reported_where_the_unclosed_quote_starts() -> None:
    # PyYAML gives up at the end of the stream (3:1 here, 7:1 below); the quote opened at 2:8.
    spec = '- name: g(Tensor x) -> Tensor\n  doc: "never closed\n'
    assert one_error(spec) == (2, 8, "YAML syntax error: while scanning a quoted scalar: found unexpected "
                                     "end of stream (the quote that starts here is never closed)")
    spec = ('- name: g(Tensor x) -> Tensor\n  special_cases:\n'
            '    - subgradient: {op: sqrt, when: "result == 0, grad: 0}\n'
            '- name: h(Tensor x) -> Tensor\n  special_cases:\n    - nan_safe: true\n')
    assert one_error(spec)[:2] == (3, 37)


def test_a_tab_is_named_as_a_tab() -> None:
    spec = "- name: g(Tensor x) -> Tensor\n  special_cases:\n\t- nan_safe: true\n"
    assert one_error(spec) == (3, 1, "YAML syntax error: a tab character: YAML indents with spaces only, and "
                                     "a tab cannot start a token; replace it with spaces")


def test_an_empty_spec_warns_in_load_spec_and_in_check(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.warns(UserWarning, match=rf"the spec {re.escape(str(path))} defines no group: it is empty"):
        handle = ag.load_spec(path)
    assert handle.groups == ()
    done = subprocess.run([sys.executable, "-m", "autograd_groups.cli", "check", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert f"{path}: warning: the spec defines no group (is the file empty?)" in done.stderr


def test_yaml_aliases_are_refused_where_they_are_used() -> None:
    spec = '- &group {name: "f()", special_cases: [nan_safe: true]}\n- *group\n'
    assert one_error(spec) == (*at(spec, 2, "*group"), "YAML aliases (*name) are not allowed in a spec; "
                                                       "write the value out")


def test_yaml_tags_are_refused_and_nothing_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = ('- name: g(Tensor x) -> Tensor\n'
            '  special_cases: !!python/object/apply:os.system ["touch pwned"]\n')
    assert one_error(spec) == (*at(spec, 2, "!!python"), "the YAML tag '!!python/object/apply:os.system' "
                                                         "is not allowed in a spec; write a plain value")
    assert list(tmp_path.iterdir()) == []


def test_unknown_key_in_a_group_with_a_suggestion() -> None:
    spec = "- name: g(Tensor x) -> Tensor\n  special_case: [nan_safe: true]\n"
    found = errors(spec)
    assert found == [
        ("<string>", *at(spec, 1, "name"), "a group has no 'special_cases'; it needs 'name' and "
                                           "'special_cases'"),
        ("<string>", *at(spec, 2, "special_case"), "unknown key 'special_case' in a group; the keys are "
                                                   "name, doc, special_cases, compile; did you mean "
                                                   "'special_cases'?"),
    ]


def test_unknown_key_in_a_rule() -> None:
    spec = subgradient("result == 0", extra=", gard: 0")
    assert one_error(spec) == (*at(spec, 3, "gard"), "unknown key 'gard' in 'subgradient'; the keys are op, "
                                                     "when, grad, input, doc; did you mean 'grad'?")


def test_unknown_kind_of_special_case() -> None:
    spec = "- name: g(Tensor x) -> Tensor\n  special_cases:\n    - nan_save: true\n"
    assert one_error(spec) == (*at(spec, 3, "nan_save"), "unknown kind of special case: 'nan_save'; the "
                                                         "kinds are subgradient, nan_safe, override; did "
                                                         "you mean 'nan_safe'?")


def test_a_special_case_with_two_kinds_is_an_indentation_slip() -> None:
    spec = ("- name: g(Tensor x) -> Tensor\n  special_cases:\n    - nan_safe: true\n"
            "      doc: misplaced\n")
    assert one_error(spec) == (*at(spec, 3, "nan_safe"), "a special case has exactly one key, subgradient, "
                                                         "nan_safe, override (as in '- nan_safe: true'); "
                                                         "this one has 'nan_safe', 'doc'")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("doc", "3", "'doc' must be a string, not an integer (3)"),
    ("doc", "[a, b]", "'doc' must be a string, not a list"),
    ("special_cases", "{}", "'special_cases' must be a non-empty list of rules (subgradient, nan_safe, "
                            "override), not a mapping"),
    ("special_cases", "[]", "'special_cases' is empty: a group needs at least one rule (subgradient, "
                            "nan_safe, override), as in '- nan_safe: true'"),
])
def test_wrong_type_of_a_group_field(field: str, value: str, message: str) -> None:
    rules = "" if field == "special_cases" else "  special_cases: [nan_safe: true]\n"
    spec = f"- name: g(Tensor x) -> Tensor\n  {field}: {value}\n{rules}"
    assert one_error(spec) == (*at(spec, 2, value), message)


@pytest.mark.parametrize(("extra", "needle", "message"), [
    (", input: -1", "-1", "'input' must be a non-negative integer (the op's input position), not an "
                          "integer (-1)"),
    (", input: true", "true", "'input' must be a non-negative integer (the op's input position), not a "
                              "boolean (True)"),
    (", grad: [0]", "[0]", "'grad' must be an expression string or a number, not a list"),
    (", doc: {a: 1}", "{a: 1}", "'doc' must be a string, not a mapping"),
])
def test_wrong_type_of_a_rule_field(extra: str, needle: str, message: str) -> None:
    spec = subgradient("result == 0", extra=extra)
    assert one_error(spec) == (*at(spec, 3, needle), message)


def test_the_top_level_must_be_a_list() -> None:
    spec = "name: g(Tensor x) -> Tensor\nspecial_cases: [nan_safe: true]\n"
    assert one_error(spec) == (1, 1, "a spec is a list of groups ('- name: group(Tensor x) -> Tensor'), "
                                     "not a mapping")


def test_nan_safe_must_be_true() -> None:
    spec = "- name: g(Tensor x) -> Tensor\n  special_cases: [nan_safe: false]\n"
    assert one_error(spec) == (*at(spec, 2, "false"), "'nan_safe' must be true or a mapping with a 'doc', "
                                                      "not a boolean (False)")


@pytest.mark.parametrize(("name", "needle", "message"), [
    ("cdist(Tensor x1 Tensor x2) -> Tensor", "Tensor x2", "expected ',' or ')' after a parameter"),
    ("cdist(Tensor x1, Tensor x1) -> Tensor", "x1)", "parameter 'x1' appears twice"),
    ("cdist(Tensor x1,) -> Tensor", ")", "expected a parameter 'Type name' (such as 'Tensor x')"),
    ("cdist(Tensor x1) Tensor", "Tensor\n", "expected '-> Type' (such as '-> Tensor') after the parameters"),
    ("(Tensor x1) -> Tensor", "(", "expected 'group_name(' at the start, as in 'cdist(Tensor x1, Tensor x2) "
                                   "-> Tensor'"),
])
def test_malformed_name_signature(name: str, needle: str, message: str) -> None:
    spec = f"- name: {name}\n  special_cases: [nan_safe: true]\n"
    line_text = spec.splitlines(keepends=True)[0]
    col = line_text.index(needle) + 1
    assert one_error(spec) == (1, col, f"malformed group signature: {message}")


def test_duplicate_group_in_one_load() -> None:
    spec = ("- name: g(Tensor x) -> Tensor\n  special_cases: [nan_safe: true]\n"
            "- name: g(Tensor y) -> Tensor\n  special_cases: [nan_safe: true]\n")
    assert one_error(spec) == (*at(spec, 3, "g("), "group 'g' is defined twice; first at <string>:1:9")


def test_conflict_with_a_group_registered_from_python() -> None:
    ag.register_rule("g", ag.NanSafe(doc="from Python"))
    spec = "- name: g(Tensor x) -> Tensor\n  special_cases: [nan_safe: true]\n"
    assert one_error(spec) == (1, 9, "group 'g' is already registered from Python (register_rule or a "
                                     "decorator) with other rules; a group has one source, so unload that "
                                     "one first, rename this group, or pass replace=True to swap its rules")


def test_conflict_with_a_group_of_another_spec_names_both(tmp_path: Path) -> None:
    first = tmp_path / "first.yaml"
    first.write_text("# the first\n- name: g(Tensor x) -> Tensor\n  special_cases: [nan_safe: true]\n")
    ag.load_spec(first)
    second = tmp_path / "second.yaml"
    second.write_text("- name:   g(Tensor x) -> Tensor\n  special_cases: [nan_safe: {doc: other}]\n")
    with pytest.raises(ag.SpecError) as info:
        ag.load_spec(second)
    assert info.value.errors == [(str(second), 1, 11, f"group 'g' is already registered by the spec at "
                                                      f"{first}:2:9 with other rules; a group has one "
                                                      f"source, so unload that one first, rename this group, "
                                                      f"or pass replace=True to swap its rules")]
    assert str(info.value) == f"{second}:1:11: {info.value.errors[0][3]}"


def test_conflicting_rules_within_one_group() -> None:
    spec = ("- name: g(Tensor x) -> Tensor\n  special_cases:\n    - nan_safe: true\n"
            "    - nan_safe: {doc: again}\n")
    assert one_error(spec) == (4, 7, "group 'g': nan_safe conflicts with nan_safe (line 3): a group has "
                                     "one nan_safe rule")


def test_unknown_op_with_close_matches() -> None:
    spec = subgradient("result == 0", op="sqrtt")
    assert one_error(spec) == (*at(spec, 3, "sqrtt"), "unknown op 'sqrtt': autograd has no backward node "
                                                      "for it; did you mean sqrt, rsqrt, sort? (op names are "
                                                      "PyTorch's, as in derivatives.yaml: sqrt, clamp_min, "
                                                      "pow, ...)")


def test_saved_value_the_op_does_not_have_lists_those_it_has() -> None:
    spec = subgradient("'where(self == 0, 1, 0) > 0'", op="pow", extra=", grad: result * other")
    found = errors(spec)
    assert found == [
        ("<string>", *at(spec, 3, "other"), "'grad' names 'other', which pow does not save; it saves "
                                            "exponent, result, self (and every rule sees 'grad')"),
    ]
    spec = subgradient("'x == 0'")
    assert one_error(spec) == (*at(spec, 3, "x =="), "'when' names 'x', which sqrt does not save; it saves "
                                                     "result (and every rule sees 'grad')")


def test_expression_syntax_error_points_into_the_expression() -> None:
    spec = subgradient('"result === 0"')
    assert one_error(spec) == (*at(spec, 3, "= 0"), "'when': syntax error in expression 'result === 0': "
                                                    "invalid syntax")
    spec = subgradient("(result == 0))")
    assert one_error(spec) == (*at(spec, 3, ")}"), "'when': syntax error in expression '(result == 0))': "
                                                   "unmatched ')'")


def test_expression_written_with_escapes_reports_the_column_inside_it() -> None:
    spec = subgradient('"r\\x65sult == 0 == 1"')
    assert one_error(spec) == (*at(spec, 3, '"r'), "'when': use one comparison (==, !=, <, <=, >, >=) at a "
                                                   "time; combine them with & and | (column 1 of the value)")


def test_unknown_function() -> None:
    spec = subgradient("'result == 0'", extra=", grad: 'grad * softplus(result)'")
    line, col, message = one_error(spec)
    assert (line, col) == at(spec, 3, "softplus")
    assert message == ("'grad': unknown function 'softplus'; the functions are abs, exp, finfo_eps, "
                       "isfinite, isinf, isnan, log, maximum, minimum, ones_like, sign, sqrt, where, "
                       "zeros_like")


def override(check: str, backward: str = "torch:zeros_like") -> str:
    return (f"- name: g(Tensor x) -> Tensor\n  special_cases:\n"
            f"    - override: {{check: '{check}', backward: '{backward}'}}\n")


@pytest.mark.parametrize(("check", "message"), [
    ("ag_no_such_module_xyz:f", "'check': cannot import module 'ag_no_such_module_xyz': ModuleNotFoundError: "
                                "No module named 'ag_no_such_module_xyz'"),
    ("math:pi", "'check': 'math:pi' is a float, not a function"),
    ("torch.is_tensor", "'check' must be 'module:function' (such as 'mypkg.rules:norm_is_zero'), not "
                        "'torch.is_tensor'"),
    ("os:__dict__", "'check': names starting with '__' are not allowed ('os:__dict__')"),
])
def test_import_failure(check: str, message: str) -> None:
    spec = override(check)
    assert one_error(spec) == (*at(spec, 3, check), message)


def test_missing_function_is_reported_where_its_name_is() -> None:
    spec = override("math:sqr")
    assert one_error(spec) == (*at(spec, 3, "sqr'"), "'check': module 'math' has no 'sqr'; did you mean "
                                                     "'sqrt' or 'isqrt'?")


def test_import_that_raises_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ag_spec_broken_module.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = override("ag_spec_broken_module:f")
    assert one_error(spec) == (*at(spec, 3, "ag_spec"), "'check': cannot import module "
                                                       "'ag_spec_broken_module': RuntimeError: broken on "
                                                       "purpose")


def test_imports_refused_when_not_allowed() -> None:
    spec = override("math:sqrt", "math:floor")
    assert errors(spec, allow_imports=False) == [
        ("<string>", *at(spec, 3, "math:sqrt"), "'check': 'math:sqrt' would import module 'math', and this "
                                                "spec is loaded with allow_imports=False; load it with "
                                                "allow_imports=True if you trust it"),
        ("<string>", *at(spec, 3, "math:floor"), "'backward': 'math:floor' would import module 'math', and "
                                                 "this spec is loaded with allow_imports=False; load it with "
                                                 "allow_imports=True if you trust it"),
    ]


def test_every_error_of_a_file_is_reported_in_order() -> None:
    spec = ("- name: a(Tensor x) -> Tensor\n"
            "  dco: typo\n"
            "  special_cases:\n"
            "    - subgradient: {op: sqrt, when: reslt == 0}\n"
            "    - subgradient: {op: sqr, when: result == 0}\n"
            "- name: b(Tensor x -> Tensor\n"
            "  special_cases: [nan_safe: yes please]\n")
    found = [(line, col) for _, line, col, _ in errors(spec)]
    assert found == [at(spec, 2, "dco"), at(spec, 4, "reslt"), at(spec, 5, "sqr,"), at(spec, 6, "->"),
                     at(spec, 7, "yes")]


def test_missing_file_and_non_utf8_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ag.SpecError) as info:
        ag.load_spec(missing)
    assert info.value.errors == [(str(missing), 1, 1, "no such spec file (YAML text must contain a newline "
                                                      "to be read as text rather than as a path)")]
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("- name: caf\xe9()\n".encode("latin-1"))
    with pytest.raises(ag.SpecError) as info:
        ag.load_spec(latin)
    (file, line, col, message), = info.value.errors
    assert (file, line, col) == (str(latin), 1, 1)
    assert message.startswith("a spec file must be UTF-8 text: 'utf-8' codec can't decode byte 0xe9")


def test_a_spec_is_a_path_or_text() -> None:
    with pytest.raises(TypeError, match="a spec is a path or YAML text"):
        ag.load_spec(b"- name: g()\n")  # type: ignore[arg-type]


@pytest.fixture
def sentinel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module that leaves a file behind if it is ever imported; cwd is an empty directory."""
    modules = tmp_path / "modules"
    modules.mkdir()
    marker = tmp_path / "imported"
    (modules / f"{SENTINEL}.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                            "def f(*args): return True\n")
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.delitem(sys.modules, SENTINEL, raising=False)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return marker


ESCAPES = [
    f"__import__('{SENTINEL}')",
    "().__class__",
    "().__class__.__bases__[0].__subclasses__()",
    "grad.__dict__",
    "[x for x in grad]",
    "lambda: 0",
    "open('f', 'w')",
    "exec('open(1)')",
    "x" * 10_000_000,
    "(" * 100_000 + "result" + ")" * 100_000,
    "(" * 300 + "result" + ")" * 300,
    "-" * 1_900 + "result",
    "9 ** 9 ** 9 ** 9 if result else 0",
]


def _short(expression: str) -> str:
    return expression if len(expression) <= 20 else f"{expression[:20]}..[{len(expression)}]"


@pytest.mark.parametrize("expression", ESCAPES, ids=_short)
def test_escape_attempts_raise_spec_error_and_run_nothing(sentinel: Path, expression: str) -> None:
    spec = subgradient(f'"{expression}"')
    line, col, message = one_error(spec)
    assert line == 3 and message.startswith("'when': ")
    assert SENTINEL not in sys.modules and not sentinel.exists()
    assert list(Path.cwd().iterdir()) == []


def test_the_sentinel_does_detect_an_import(sentinel: Path) -> None:
    """The positive control of the test above: an allowed import is seen."""
    spec = override(f"{SENTINEL}:f", f"{SENTINEL}:f")
    errors(spec, allow_imports=False)
    assert SENTINEL not in sys.modules and not sentinel.exists()
    ag.load_spec(spec)
    assert SENTINEL in sys.modules and sentinel.exists()


# What the Python API refuses at registration, a spec refuses at load, with the position.

def test_an_input_the_op_does_not_have() -> None:
    spec = subgradient("'result == 0'", extra=", input: 3")
    assert one_error(spec) == (*at(spec, 3, "3}"), "'input': input 3 is out of range: sqrt has 1 input "
                                                   "(position 0, in the order of next_functions)")


@pytest.mark.parametrize(("when", "needle", "message"), [
    ("1", "1}", "'when' is the constant 1: it reads none of the op's values"),
    ("true", "true}", "'when' is the constant True: it reads none of the op's values"),
    ("'True'", "True'", "'when' is the constant True: it reads none of the op's values"),
    ("result", "result}", "'when' must be an elementwise condition (a comparison such as 'result == 0', "
                          "combined with &, | and ~), not a saved value ('result')"),
    ("'result * 2'", "result *", "'when' must be an elementwise condition (a comparison such as 'result == "
                                 "0', combined with &, | and ~), not a number ('result * 2')"),
])
def test_a_when_that_is_not_a_condition(when: str, needle: str, message: str) -> None:
    spec = subgradient(when)
    line, col, found = one_error(spec)
    assert (line, col) == at(spec, 3, needle)
    assert found.startswith(message)


def test_rules_that_conflict_by_meaning_within_one_group() -> None:
    spec = ("- name: g(Tensor x) -> Tensor\n  special_cases:\n"
            "    - subgradient: {op: sqrt, when: 'result == 0', grad: 'grad * 1'}\n"
            "    - subgradient: {op: sqrt, when: '(0==result)', grad: 'grad * 2'}\n"
            "    - subgradient: {op: sqrt, when: 'result==0.0', grad: '1.0 * grad'}\n")
    assert errors(spec) == [
        ("<string>", 4, 7, "group 'g': subgradient(sqrt: (0==result) -> grad * 2) conflicts with "
                           "subgradient(sqrt: result == 0 -> grad * 1) (line 3): same op and condition, but "
                           "a different grad"),
        ("<string>", 5, 7, "group 'g': subgradient(sqrt: result==0.0 -> 1.0 * grad) is the rule of line 3 "
                           "again; remove one of them"),
        ("<string>", 5, 7, "group 'g': subgradient(sqrt: result==0.0 -> 1.0 * grad) conflicts with "
                           "subgradient(sqrt: (0==result) -> grad * 2) (line 4): same op and condition, "
                           "but a different grad"),
    ]


def test_a_python_rule_that_conflicts_with_a_loaded_one_names_the_spec_line(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(subgradient("'result == 0'"))
    ag.load_spec(path)
    with pytest.raises(ag.RuleError, match=re.escape(
            f"conflicts with subgradient(sqrt: result == 0 -> 0) (registered at {path}:3:7): same op and "
            f"condition, but a different grad")):
        ag.register_rule("g", ag.Subgradient(op="sqrt", when="0 == result", grad="grad * 2"))


def test_a_group_level_condition_is_refused_where_it_is_written() -> None:
    spec = subgradient("'(result == 0).any()'")
    assert one_error(spec) == (*at(spec, 3, "(result"), "'when': method calls such as .any() are not allowed "
                                                        "in an expression: it is computed elementwise, and a "
                                                        "condition on the whole group belongs in an override "
                                                        "rule")

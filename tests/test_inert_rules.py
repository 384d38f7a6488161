"""Rules that would never take effect are said, by name (docs/guarantees.md): a rule registered under a
name no group uses, a rule whose op is in no node of its group, a condition that can never hold,
a constant gradient other than 0."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import autograd_groups as ag
from autograd_groups import cli
from autograd_groups.rules import registry

SQRT_AT_ZERO = ag.Subgradient(op="sqrt", when="result == 0", grad=0)
HEAD = "- name: g(Tensor x) -> Tensor\n  special_cases:\n"


def _inert(run) -> list[str]:  # type: ignore[no-untyped-def]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, ag.InertRuleWarning)]


def test_a_misspelled_rule_name_is_said_when_the_group_is_created() -> None:
    with ag.registry_scope():
        ag.register_rule("inert.lenght", SQRT_AT_ZERO)
        found = _inert(lambda: ag.autograd_group("inert.length")(lambda v: (v * v).sum().sqrt()))
    assert len(found) == 1
    assert found[0].startswith("group 'inert.length' has no rules, but rules are registered under "
                               "'inert.lenght' (registered at ")
    assert "a name no group uses: they never take effect. If they are this group's, register them " \
           "under 'inert.length' (or name the group 'inert.lenght')" in found[0]


def test_a_misspelled_rule_name_is_said_when_the_group_first_runs_without_rules() -> None:
    with ag.registry_scope():
        length = ag.autograd_group("inert.distance")(lambda v: (v * v).sum().sqrt())
        ag.register_rule("inert.distnace", SQRT_AT_ZERO)  # after the group was made
        x = torch.zeros(3, requires_grad=True)
        found = _inert(lambda: length(x).backward())
        assert len(found) == 1 and "group 'inert.distance' has no rules" in found[0]
        assert x.grad is not None and x.grad.isnan().all()  # the NaN the rule would have fixed
        assert _inert(lambda: length(x)) == []  # once per name
        assert registry.unused()["inert.distnace"] == ["inert.distance"]


def test_stats_lists_rules_under_names_no_group_used(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "typo.py"
    source.write_text(
        "import torch, autograd_groups as ag\n"
        "ag.register_rule('inert.cli.lenght', ag.Subgradient(op='sqrt', when='result == 0', grad=0))\n"
        "length = ag.autograd_group('inert.cli.length')(lambda v: (v * v).sum().sqrt())\n"
        "length(torch.ones(3, requires_grad=True)).backward()\n")
    with ag.registry_scope(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ag.InertRuleWarning)
        assert cli.main(["stats", str(source)]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert ("rules under 'inert.cli.lenght', a name no group used, never took effect (1 rule); did "
                "you mean 'inert.cli.length'?") in out
        assert cli.main(["stats", str(source), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
    assert report["unused_rules"]["inert.cli.lenght"] == ["inert.cli.length"]


def test_a_rule_whose_op_is_not_in_its_group_names_the_ops_it_has_and_the_likely_one() -> None:
    with ag.registry_scope():
        ag.register_rule("inert.pow", SQRT_AT_ZERO)
        length = ag.autograd_group("inert.pow")(lambda v: (v * v).sum(-1) ** 0.5)  # a pow node
        x = torch.zeros(2, 3, requires_grad=True)
        found = _inert(lambda: length(x))
        assert len(found) == 1
        assert ("group 'inert.pow' (created at " in found[0] and "rule subgradient(sqrt: result == 0 -> 0): "
                "no node of this instance is a sqrt, so the rule never fires here; the instance's ops are "
                "mul, pow, sum, and the likely one is 'pow': set op='pow' in the rule" in found[0])
        assert _inert(lambda: length(x)) == []  # once per group and rule


def test_a_group_path_that_needs_no_rule_is_not_accused() -> None:
    # vector_norm with ord=1 has neither sqrt nor pow: no rule of it applies, and none is needed.
    x = torch.zeros(2, 3, requires_grad=True)
    assert _inert(lambda: ag.ops.vector_norm(x, ord=1, dim=-1).sum().backward()) == []
    assert _inert(lambda: ag.ops.cdist(x, x, p=2.0).sum().backward()) == []


@pytest.mark.parametrize(("when", "fix"), [
    ("result == nan", "NaN equals nothing and orders against nothing, so this is false everywhere; to find "
                      "NaNs, write 'isnan(result)'"),
    ("nan != result", None),
    ("result > inf", "no number and no infinity is above inf, so this is false everywhere; to find "
                     "infinities, write 'result == inf' or 'isinf(result)'"),
    ("-inf > result", "no number and no infinity is below -inf"),
    ("(result == 0) & (result == 1)", "asks 'result == 0' and 'result == 1' at once: no value equals two "
                                      "numbers, so this is false everywhere; to accept either, join them "
                                      "with | instead of &"),
    ("(result == 0) | (result == 1)", None),
    ("result >= inf", None),
])
def test_a_condition_that_can_never_hold_is_refused_at_registration_and_in_check(when: str,
                                                                                 fix: str | None) -> None:
    spec = f"{HEAD}    - subgradient: {{op: sqrt, when: '{when}'}}\n"
    if fix is None:  # these can hold
        ag.Subgradient(op="sqrt", when=when)
        assert ag.check_spec(spec) == []
        return
    with pytest.raises(ag.RuleError, match="'when' of the sqrt rule can never hold: it ") as caught:
        ag.Subgradient(op="sqrt", when=when)
    assert fix in str(caught.value)
    ((_, line, col, message),) = ag.check_spec(spec)
    assert (line, col) == (3, 38) and message.startswith("'when' can never hold") and fix in message


@pytest.mark.parametrize("grad", [0.5, 1, -2.0, "1 + 1", True])
def test_a_constant_grad_other_than_zero_is_refused_with_the_fix(grad: object) -> None:
    with pytest.raises(ag.RuleError, match=r"'grad' of the sqrt rule is the constant .*: it would pass .* on "
                                           r"whatever gradient flows in .* write 'grad \* .*'; for a "
                                           r"group-level replacement of the gradient, use an override"):
        ag.Subgradient(op="sqrt", when="result == 0", grad=grad)  # type: ignore[arg-type]
    written = f"'{grad}'" if isinstance(grad, str) else str(grad).lower()
    spec = f"{HEAD}    - subgradient: {{op: sqrt, when: 'result == 0', grad: {written}}}\n"
    ((_, line, _, message),) = ag.check_spec(spec)
    assert line == 3 and message.startswith("'grad' is the constant") and "write 'grad * " in message


def test_a_local_derivative_written_as_a_factor_of_grad_is_a_rule() -> None:
    for grad in (0, 0.0, "0", "grad * 0.5", "0.5 * grad", lambda grad: grad * 0.5):
        ag.Subgradient(op="sqrt", when="result == 0", grad=grad)


def test_a_tag_chain_whose_op_is_tagged_later_is_not_accused_and_a_group_without_it_is() -> None:
    """docs/groups.md's tag example: its first tag marks a pow, its third the sqrt the rule names."""
    ag.register_rule("inert.tagged", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    x = torch.zeros(2, 3, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ag.RuleWarning)
        s = ag.tag(x.pow(2), "inert.tagged")
        s = ag.tag(s.sum(-1), "inert.tagged")
        ag.tag(s.sqrt(), "inert.tagged").sum().backward()
    assert torch.equal(x.grad, torch.zeros(2, 3))
    with pytest.warns(ag.InertRuleWarning, match="no node of this instance is a sqrt"):
        ag.autograd_group("inert.tagged")(lambda v: v.pow(2).sum(-1).pow(0.5))(x)

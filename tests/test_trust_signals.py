"""Issue 28 §4: smaller signals that told the user something untrue or nothing at all."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

import autograd_groups as ag
from autograd_groups import cli


def test_detect_nonfinite_at_a_zero_times_inf_suggests_nan_safe_and_a_subgradient() -> None:
    """The tutorial's masked length (§4): the rule it names, either way, makes the gradient finite."""
    length = ag.autograd_group("signals.length")(lambda v: v.pow(2).sum(-1).sqrt())
    v = torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([0.0, 1.0])
    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError) as error:
        (length(v) * mask).sum().backward()
    message = str(error.value)
    assert "0 * inf" in message and "ag.register_rule('signals.length', ag.NanSafe())" in message
    assert "ag.Subgradient(op='sqrt', when=..., grad=0)" in message
    for rule in (ag.NanSafe(), ag.Subgradient(op="sqrt", when="result == 0", grad=0)):
        with ag.registry_scope():
            ag.register_rule("signals.length", rule)
            v.grad = None
            with ag.detect_nonfinite():
                (length(v) * mask).sum().backward()
            torch.testing.assert_close(v.grad, torch.tensor([[0.0, 0.0], [0.6, 0.8]]))


ATTEND = textwrap.dedent('''
    import sys
    import torch
    import autograd_groups as ag

    ag.register_rule("attend", ag.NanSafe())


    @ag.autograd_group("attend")
    def attend(scores, values):
        return torch.softmax(scores, -1) @ values


    row = -torch.inf if "--masked" in sys.argv else 0.0
    scores = torch.tensor([[0.0, 1.0], [row, row]], requires_grad=True)
    attend(scores, torch.ones(2, 3, requires_grad=True)).sum().backward()
    print(bool(scores.grad.isnan().any()))
''')


@pytest.mark.parametrize("masked", [True, False])
def test_stats_says_why_a_nan_safe_rule_that_changed_nothing_left_non_finite_gradients(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], masked: bool) -> None:
    """A softmax of a row that is all -inf makes NaN in the forward: no 0 * inf for NaN-safe to zero."""
    script = tmp_path / "attend.py"
    script.write_text(ATTEND)
    assert cli.main(["stats", str(script), *(["--", "--masked"] if masked else [])]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(str(masked))
    said = ("nan_safe changed no element, yet its input gradients came out non-finite" in out
            and "ag.detect_nonfinite()" in out)
    assert said == masked

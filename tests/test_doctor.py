"""``autograd-groups doctor`` on a corpus of small training scripts whose NaN has a known cause (each
script's docstring cites the public report it is built from): the class, where the value is born,
and for classes A and B a checked fix that, applied, gives finite gradients equal to the original's
wherever those were finite."""

from __future__ import annotations

import ast
import gc
import json
import math
import re
import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import autograd_groups as ag
from autograd_groups.cli import main
from autograd_groups.doctor.diagnose import diagnose
from autograd_groups.doctor.report import Diagnosis
from autograd_groups.doctor.session import Backward, Session, Stop
from autograd_groups.doctor.tensors import finite_groups
from autograd_groups.script import run_script
from tests.conftest import line_of

CORPUS = Path(__file__).resolve().parent / "doctor_corpus"

#: script -> (class, phase, node, op, function); the line is the one marked "# born".
FOUND = {
    "a_softplus_where.py": ("A", "backward", "ExpBackward0", "exp", "softplus"),
    "a_masked_distance.py": ("A", "backward", "SqrtBackward0", "sqrt", "pairwise"),
    "a_masked_division.py": ("A", "backward", "DivBackward0", "div", "mean_per_bin"),
    "a_masked_direction.py": ("A", "backward", "DivBackward0", "div", "directions"),
    "a_gradient_penalty.py": ("A", "backward", "PowBackward0", "pow", "energy"),
    "a_masked_logsumexp.py": ("A", "backward", "LogBackward0", "log", "log_partition"),
    "a_masked_attention.py": ("A", "backward", "BmmBackward0", "bmm", "attend"),
    "b_gradient_penalty_norm.py": ("B", "backward", "SqrtBackward0", "sqrt", "gradient_norm"),
    "b_rmse_perfect_fit.py": ("B", "backward", "SqrtBackward0", "sqrt", "rmse"),
    "b_pairwise_distance.py": ("B", "backward", "SqrtBackward0", "sqrt", "spread"),
    "b_per_sample_vmap.py": ("B", "backward", "SqrtBackward0", "sqrt", "distance"),
    "b_compiled_distance.py": ("B", "backward", "SqrtBackward0", "sqrt", "spread"),
    "c_normalize_zero.py": ("C", "forward", "DivBackward0", "div", "unit"),
    "c_log_of_softmax.py": ("C", "forward", "LogBackward0", "log", "cross_entropy"),
    "d_softmax_overflow.py": ("D", "forward", "ExpBackward0", "exp", "softmax"),
    "d_poisson_rate.py": ("D", "forward", "ExpBackward0", "exp", "<module>"),
    "e_nan_in_batch.py": ("E", "forward", None, "linear", "<module>"),
    "e_bad_checkpoint.py": ("E", "forward", None, "linear", "<module>"),
}
CLEAN = ["clean_mlp.py", "clean_erased_nan.py"]
#: The backward passes of one training step (a gradient penalty takes two), to find the step the
#: doctor's backward pass falls in.
BACKWARDS_PER_STEP = {"a_gradient_penalty.py": 2, "b_gradient_penalty_norm.py": 2}

_reports: dict[str, dict] = {}


def report_of(name: str) -> dict:
    """The doctor's JSON report on a corpus script (each script diagnosed once per session)."""
    if name not in _reports:
        report, code = diagnose(str(CORPUS / name))
        assert code == 0
        _reports[name] = json.loads(json.dumps(report.to_json()))
    return _reports[name]


def _softmax_of_a_masked_row_is_nan() -> bool:
    return bool(torch.tensor([float("-inf")] * 2).softmax(-1).isnan().any())


def _attention_over_no_key_is_nan() -> bool:
    attention = torch.nn.MultiheadAttention(embed_dim=4, num_heads=1, batch_first=True)
    x = torch.ones(1, 2, 4)
    with torch.no_grad():
        out, _ = attention(x, x, x, key_padding_mask=torch.tensor([[True, True]]))
    return bool(out.isnan().any())


#: The scripts whose NaN is PyTorch's own choice at a row with nothing to attend to, asked of the
#: running release: a release that returns a finite row there makes no NaN to find.
MADE_BY_THE_RELEASE = {"a_masked_attention.py": _softmax_of_a_masked_row_is_nan,
                       "a_padded_attention.py": _attention_over_no_key_is_nan}


def found_here(name: str) -> bool:
    """Whether the running release makes the script's NaN; where it does not, the doctor says clean."""
    ask = MADE_BY_THE_RELEASE.get(name)
    if ask is None or ask():
        return True
    assert report_of(name)["status"] == "clean"
    return False


@pytest.mark.parametrize("name", sorted(FOUND))
def test_the_doctor_finds_the_birth_and_its_class(name: str) -> None:
    if not found_here(name):
        return
    cls, phase, node, op, function = FOUND[name]
    report = report_of(name)
    assert report["status"] == "found"
    assert report["class"] == cls
    born = report["born"]
    assert (born["phase"], born["node"], born["op"], born["function"]) == (phase, node, op, function)
    assert born["file"] == str(CORPUS / name)
    assert born["line"] == line_of(str(CORPUS / name), "# born")
    assert born["elements"] >= 1 and born["indices"]
    assert report["backward_calls"] >= 1
    if phase == "backward":
        assert born["incoming"] == ("zero" if cls == "A" else "nonzero")
    proposals = report["proposals"]
    assert proposals[-1]["kind"] == "advice"
    if cls in ("C", "D", "E"):
        assert not any(p["checked"] for p in proposals if p["kind"] not in ("native", "builtin")), \
            "no gradient rule fixes a forward value"


def test_a_mask_filled_with_minus_infinity_gets_the_finite_fill_checked() -> None:
    """The NaN is born in the backward of the product with the values; the fix goes to the line
    that filled the mask, the forward call that first made a non-finite value."""
    if not found_here("a_masked_attention.py"):
        return
    rewrite = report_of("a_masked_attention.py")["proposals"][0]
    assert (rewrite["kind"], rewrite["checked"]) == ("rewrite", True), rewrite["check"]
    assert ('+    scores = scores.masked_fill(~keep[:, None, :], torch.finfo(scores.dtype).min)'
            in rewrite["diff"])


@pytest.mark.parametrize("fill, fixed", [
    ('scores = torch.where(keep[:, None, :], scores, -float("inf"))',
     "scores = torch.where(keep[:, None, :], scores, torch.finfo(scores.dtype).min)"),
    ('scores.masked_fill_(~keep[:, None, :], float("-inf"))',
     "scores.masked_fill_(~keep[:, None, :], torch.finfo(scores.dtype).min)"),
    ('scores[:, :].masked_fill_(~keep[:, None, :], -math.inf)',
     "scores[:, :].masked_fill_(~keep[:, None, :], torch.finfo(scores[:, :].dtype).min)"),
    # Two fills on a line: the one that made the row all -inf, not the one around it.
    ('scores = scores.masked_fill(~keep[:, None, :], float("-inf")).masked_fill(scores > 1e9, -math.inf)',
     "scores = scores.masked_fill(~keep[:, None, :], torch.finfo(scores.dtype).min)"
     ".masked_fill(scores > 1e9, -math.inf)"),
    ('scores = (scores * 1.0).masked_fill(~keep[:, None, :], float("-inf"))',
     "scores = (scores * 1.0).masked_fill(~keep[:, None, :], torch.finfo((scores * 1.0).dtype).min)")])
def test_a_where_or_an_in_place_fill_of_minus_infinity_gets_the_finite_fill_checked(
        fill: str, fixed: str, tmp_path: Path) -> None:
    """In place, on the tensor or on a view of it: the product that made the scores is no birth,
    though its output holds -inf by the end of the step."""
    if not found_here("a_masked_attention.py"):
        return
    shutil.copy(CORPUS / "dump.py", tmp_path)
    script = tmp_path / "filled_attention.py"
    script.write_text("import math\n" + (CORPUS / "a_masked_attention.py").read_text().replace(
        'scores = scores.masked_fill(~keep[:, None, :], float("-inf"))', fill))
    report, _ = diagnose(str(script))
    rewrite = report.proposals[0]
    assert (report.cls, rewrite.kind, rewrite.checked) == ("A", "rewrite", True), rewrite.check
    assert f"+    {fixed}\n" in rewrite.diff


def test_a_log_of_a_softmax_gets_the_native_log_softmax_checked() -> None:
    """The softmax is assigned on the line before the log: the native op takes its input."""
    native, rewrite = report_of("c_log_of_softmax.py")["proposals"][:2]
    assert (native["kind"], native["checked"], rewrite["kind"], rewrite["checked"]) == (
        "native", True, "rewrite", False)
    new = "+    return -torch.log_softmax(z, dim=-1)[torch.arange(len(y)), y].mean()  # born"
    assert new in native["diff"]


@pytest.mark.parametrize("name", sorted(n for n, f in FOUND.items()
                                         if f[0] in "ABC" and f[3] in ("sqrt", "log", "div")))
def test_an_epsilon_is_shown_only_as_not_recommended_with_its_distortion(name: str) -> None:
    """Where the born op takes an epsilon (sqrt, log, a division), the epsilon is shown, never
    checked, with what the replay found and the slope it gives near the point."""
    op = FOUND[name][3]
    (shown,) = [p for p in report_of(name)["proposals"] if p["summary"].startswith("not recommended")]
    assert (shown["kind"], shown["checked"]) == ("rewrite", False) and "+ 1e-12" in shown["diff"]
    assert shown["check"].startswith("at the bad step") and "; but near the point, where" in shown["check"]
    # The slope with each epsilon against the op's own, computed here from the op's formula.
    at = {"sqrt": 1e-14, "log": 1e-7, "div": 1e-7}[op]
    for eps in (1e-12, 1e-8):
        ratio = {"sqrt": (at / (at + eps)) ** 0.5, "log": at / (at + eps), "div": (at / (at + eps)) ** 2}[op]
        said = f"{1 / ratio:,.0f}×" if ratio < 0.1 else f"{1 / ratio:.2g}×" if ratio < 0.5 else \
            f"{100 * (1 - ratio):.2g}%"
        assert f"{eps:g} is {said} too small" in shown["check"], (said, shown["check"])
    assert "with a clamp_min(1e-12) it is 0 below 1e-12" in shown["check"]


def test_of_two_ops_on_the_born_line_the_fix_goes_to_the_one_that_made_the_value(tmp_path: Path) -> None:
    """Two logs on one line, the second of a 0: the epsilon goes into the second."""
    script = tmp_path / "two.py"
    script.write_text("import torch\n"
                      "a = torch.nn.Parameter(torch.ones(3))\n"
                      "b = torch.nn.Parameter(torch.tensor([1.0, 0.0, 2.0]))\n"
                      "loss = torch.log(a).sum() + torch.log(b).sum()\n"
                      "loss.backward()\n")
    report, _ = diagnose(str(script))
    assert (report.cls, report.born.line, report.born.columns) == ("C", 4, (28, 40))
    (shown,) = [p for p in report.proposals if p.summary.startswith("not recommended")]
    assert "+loss = torch.log(a).sum() + torch.log(b + 1e-12).sum()" in shown.diff


def test_a_birth_at_another_op_gets_no_epsilon() -> None:
    proposals = report_of("a_softplus_where.py")["proposals"]
    assert not any(p["summary"].startswith("not recommended") for p in proposals)


def test_a_sum_of_squares_on_the_line_before_the_sqrt_gets_the_native_norm(tmp_path: Path) -> None:
    script = tmp_path / "two_lines.py"
    script.write_text("import torch\n"
                      "w = torch.nn.Parameter(torch.zeros(4, 3))\n"
                      "def length(v):\n"
                      "    squares = (v ** 2).sum(-1)\n"
                      "    return squares.sqrt()\n"
                      "length(w).sum().backward()\n")
    report, _ = diagnose(str(script))
    native = report.proposals[0]
    assert (report.cls, native.kind, native.checked) == ("B", "native", True), native.check
    assert "+    return torch.linalg.vector_norm(v, dim=-1)" in native.diff


def test_a_variable_assigned_from_itself_is_not_looked_through(tmp_path: Path) -> None:
    """``v = (v ** 2).sum(-1)`` then ``v.sqrt()``: the norm of the first ``v`` is no expression on the
    sqrt's line, so no native op is proposed (its ``v`` would be the sum)."""
    script = tmp_path / "shadow.py"
    script.write_text("import torch\n"
                      "w = torch.nn.Parameter(torch.zeros(4, 3))\n"
                      "def length(v):\n"
                      "    v = (v ** 2).sum(-1)\n"
                      "    return v.sqrt()\n"
                      "length(w).sum().backward()\n")
    report, _ = diagnose(str(script))
    assert report.cls == "B" and not any(p.kind == "native" for p in report.proposals)


def _diagnosed(script: Path, text: str) -> Diagnosis:
    """The doctor's report on ``text``, written as ``script``."""
    script.write_text(text)
    return diagnose(str(script))[0]


def _natively(expression: str, inputs: str, tmp_path: Path) -> list:
    script = tmp_path / "native.py"
    script.write_text(f"import torch\n{inputs}\n"
                      f"def f(x, y):\n"
                      f"    return {expression}\n"
                      f"f(x, y).sum().backward()\n")
    report, code = diagnose(str(script))
    assert code == 0 and report.cls in ("A", "C"), report.cls
    return report.proposals


def _finite_grads(fn, *inputs: torch.Tensor) -> bool:
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    return all(bool(torch.isfinite(g).all()) for g in torch.autograd.grad(fn(*leaves).sum(), leaves))


_AT_ZERO = ("x = torch.tensor([0.0, 0.3], requires_grad=True)\n"
            "y = torch.tensor([0.0, 0.5], requires_grad=True)")


@pytest.mark.parametrize("expression, native, builtin", [
    ("x * torch.log(y)", "torch.xlogy(x, y)", "ag.ops.xlogy(x, y)"),
    ("torch.atan(y / x)", "torch.atan2(y, x)", "ag.ops.atan2(y, x)")])
def test_x_log_y_and_atan_of_a_ratio_get_their_native_ops(expression: str, native: str, builtin: str,
                                                          tmp_path: Path) -> None:
    """The native op is proposed, and checked, exactly where the running release's backward is
    finite at the point (asked, not assumed); the built-in wherever its rule makes it so."""
    proposals = {p.kind: p for p in _natively(expression, _AT_ZERO, tmp_path)}
    x, y = torch.tensor([0.0, 0.3]), torch.tensor([0.0, 0.5])
    op = getattr(torch, native.split("(")[0].removeprefix("torch."))
    finite = _finite_grads(op, *((x, y) if "xlogy" in native else (y, x)))
    assert ("native" in proposals) == finite
    if finite:
        assert f"+    return {native}" in proposals["native"].diff and proposals["native"].checked
    assert f"+    return {builtin}" in proposals["builtin"].diff and proposals["builtin"].checked


@pytest.mark.parametrize("lines, native", [
    # F.softmax is a function of F, not a method of a tensor F.
    (["import torch.nn.functional as F", "x = torch.tensor([[0.0, -200.0, 1.0]], requires_grad=True)",
      "def f(x):", "    return -torch.log(F.softmax(x, dim=-1))[0, 0]"],
     "    return -torch.log_softmax(x, dim=-1)[0, 0]"),
    # A keepdim given by position is kept.
    (["x = torch.zeros(3, 2, requires_grad=True)", "w = torch.arange(3.0)", "def f(x):",
      "    return ((x[:, None] - x[None, :]).pow(2).sum(-1, True).sqrt() * w).sum()"],
     "    return (torch.linalg.vector_norm(x[:, None] - x[None, :], dim=-1, keepdim=True) * w).sum()"),
    # A square written as a product of one name with itself.
    (["x = torch.zeros(3, 2, requires_grad=True)", "def f(x):",
      "    return torch.sqrt(torch.sum(x * x, dim=-1)).sum()"],
     "    return torch.linalg.vector_norm(x, dim=-1).sum()"),
    # A tuple of dims stays one.
    (["x = torch.zeros(2, 2, 2)", "x[1] = 1.0", "x.requires_grad_()", "def f(x):",
      "    return (x / x.pow(2).sum(dim=(1, 2), keepdim=True).sqrt())[1].sum()"],
     "    return (torch.nn.functional.normalize(x, dim=(1, 2)))[1].sum()")])
def test_a_native_op_keeps_what_the_expression_computes(lines: list[str], native: str,
                                                       tmp_path: Path) -> None:
    """Proposed, and checked, where the running release's backward of the native op is finite at
    the point (asked, not assumed)."""
    report = _diagnosed(tmp_path / "native.py", "\n".join(["import torch", *lines, "f(x).backward()", ""]))
    fixed: dict = {}
    exec("\n".join(["import torch", *lines[:-1], native]), fixed)
    x = fixed["x"].detach()
    if not _finite_grads(fixed["f"], x):
        assert "native" not in [p.kind for p in report.proposals]
        return
    proposal = report.proposals[0]
    assert (proposal.kind, proposal.checked) == ("native", True), proposal.check
    assert f"\n+{native}\n" in proposal.diff


_SPREAD = "    return (x[:, None] - x[None, :]).pow(2).sum(-1).sqrt().sum()\n"
_TRAIN = "x = torch.zeros(3, 2, requires_grad=True)\nspread(x).backward()\n"


@pytest.mark.parametrize("files", [
    # Defined and trained inside the main block: the rule must be registered before the block.
    {"train.py": "import torch\nif __name__ == '__main__':\n    def spread(x):\n    " + _SPREAD
                 + "".join("    " + line + "\n" for line in _TRAIN.splitlines())},
    # An import below the function: the library must be imported above its decorator.
    {"train.py": "import torch\ndef spread(x):\n" + _SPREAD + "import math\n" + _TRAIN},
    # A module of the user's that ends without a newline, whose function ends the file.
    {"train.py": "import torch\nfrom helpers import spread\n" + _TRAIN,
     "helpers.py": "def spread(x):\n" + _SPREAD.rstrip("\n")}])
def test_a_rule_is_placed_where_it_runs_and_its_diff_applies(files: dict[str, str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    report, _ = diagnose("train.py")
    rule = next(p for p in report.proposals if p.kind == "rule")
    assert rule.checked, rule.check
    for i, proposal in enumerate(p for p in report.proposals if p.diff):
        copy = tmp_path / f"copy{i}"
        copy.mkdir()
        for name in files:
            shutil.copy(tmp_path / name, copy)
        (copy / "fix.diff").write_text(proposal.diff)
        subprocess.run(["git", "apply", "fix.diff"], cwd=copy, check=True)


_LOGITS = ("model = torch.nn.Linear(4, 3)\n"
           "x, target = torch.randn(2, 4), torch.tensor([0, 2])\n"
           "ban = torch.tensor([[True, False, False], [False, False, False]])\n")


@pytest.mark.parametrize("lines, op", [
    # The target's logit filled with -inf, or masked by an additive -inf: an infinity meant, not an
    # overflow of float32.
    (_LOGITS + "logits = model(x).masked_fill(ban, float('-inf'))\n", "masked_fill"),
    (_LOGITS + "logits = model(x) + torch.zeros(2, 3).masked_fill(ban, float('-inf'))\n", "add"),
    # An in-place log at 0: its input holds -inf by the end of the step.
    ("w = torch.nn.Parameter(torch.tensor([1.0, 0.0, 2.0]))\nlogits = w * 1.0\nlogits.log_()\n", "log_")])
def test_an_infinity_given_or_at_a_pole_is_no_overflow(lines: str, op: str, tmp_path: Path) -> None:
    report = _diagnosed(tmp_path / "meant.py",
                        "import torch\ntorch.manual_seed(0)\n" + lines
                        + "loss = torch.nn.functional.cross_entropy(logits, target) if logits.dim() == 2 "
                          "else logits.sum()\n"
                          "loss.backward()\n")
    assert (report.cls, report.born.phase, report.born.op) == ("C", "forward", op)
    if op == "log_":  # its input holds -inf by now: not shown as the value it was
        assert report.born.values == {}


def test_a_mean_whose_sum_overflows_is_an_overflow(tmp_path: Path) -> None:
    """Every element finite and none 0: the reduction's sum passes float32's range (D), though no
    element of its input lines up with its one output."""
    report = _diagnosed(tmp_path / "mean.py",
                        "import torch\nw = torch.nn.Parameter(torch.ones(8))\n(w * 3e38).mean().backward()\n")
    assert (report.cls, report.born.phase, report.born.op) == ("D", "forward", "mean")


@pytest.mark.parametrize("change, cls", [
    # The script writes a NaN into a weight between two steps: the optimizer left it finite.
    ("    if step == 2:\n        with torch.no_grad():\n            model.weight[0, 0] = math.nan\n", "E"),
    # The optimizer itself makes it NaN.
    ("    if step == 2:\n        opt.param_groups[0]['lr'] = float('inf')\n", "F")])
def test_a_parameter_the_script_made_non_finite_is_e_and_one_the_optimizer_made_is_f(
        change: str, cls: str, tmp_path: Path) -> None:
    report = _diagnosed(tmp_path / "steps.py", "import math\nimport torch\n"
                                               "torch.manual_seed(0)\n"
                                               "model = torch.nn.Linear(3, 1)\n"
                                               "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
                                               "x, y = torch.randn(4, 3), torch.randn(4, 1)\n"
                                               "for step in range(5):\n"
                                               + change +
                                               "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
                                               "    opt.zero_grad()\n"
                                               "    loss.backward()\n"
                                               "    opt.step()\n")
    assert (report.cls, report.born.op) == (cls, "linear")


@pytest.mark.parametrize("lines, cls", [
    # Two micro-batches' finite gradients of 2e38 sum to more than float32 holds: no op made it.
    ("v = torch.nn.Parameter(torch.ones(1))\nfor micro in range(2):\n    (v * 2e38).sum().backward()\n", "D"),
    # The gradient given to the backward holds a NaN: data.
    ("(w * 2).backward(torch.tensor([1.0, math.nan, 1.0]))\n", "E")])
def test_a_finding_with_no_birth_is_told_by_what_the_backward_summed_or_was_given(
        lines: str, cls: str, tmp_path: Path) -> None:
    report = _diagnosed(tmp_path / "unborn.py",
                        "import math\nimport torch\nw = torch.nn.Parameter(torch.ones(3))\n" + lines)
    assert (report.status, report.cls, report.born) == ("found", cls, None)


@pytest.mark.parametrize("forward, backward, found", [
    ("x * math.nan", "g * 2", ("C", "forward", "Bad")),
    ("x * 2", "g * math.nan", ("B", "backward", "bad"))])
def test_a_custom_function_is_located_at_the_line_that_applies_it(forward: str, backward: str, found: tuple,
                                                                  tmp_path: Path) -> None:
    """``Function.apply`` is no torch function: the forward's mode is told of it all the same, so a
    NaN its forward makes is born there (not data entering the next op), and its node has its line."""
    original = torch.autograd.Function.__dict__["apply"]
    report = _diagnosed(tmp_path / "custom.py", "import math\nimport torch\n"
                                                "class Bad(torch.autograd.Function):\n"
                                                "    @staticmethod\n"
                                                f"    def forward(ctx, x):\n        return {forward}\n"
                                                "    @staticmethod\n"
                                                f"    def backward(ctx, g):\n        return {backward}\n"
                                                "w = torch.nn.Parameter(torch.ones(3))\n"
                                                "y = Bad.apply(w * 3)\n"
                                                "y.sum().backward()\n")
    assert (report.cls, report.born.phase, report.born.op, report.born.line) == (*found, 11)
    assert torch.autograd.Function.__dict__["apply"] is original  # the replay put it back


def test_the_epsilon_goes_into_the_division_that_made_the_value(tmp_path: Path) -> None:
    """Of two divisions on the line, the one by the norm, not the one around it."""
    report = _diagnosed(tmp_path / "divided.py",
                        "import torch\n"
                        "x = torch.zeros(2, 3)\n"
                        "x[1] = 1.0\n"
                        "x.requires_grad_()\n"
                        "def f(x):\n"
                        "    return (x / x.norm(dim=-1, keepdim=True) / 2.0)[1].sum()\n"
                        "f(x).backward()\n")
    epsilon = next(p for p in report.proposals if p.summary.startswith("not recommended"))
    assert "\n+    return (x / (x.norm(dim=-1, keepdim=True) + 1e-12) / 2.0)[1].sum()\n" in epsilon.diff


@pytest.mark.parametrize("change", ["sq[0, 1] = 4.0", "sq.mul_(2.0)"])
def test_a_variable_changed_in_place_is_not_looked_through(change: str, tmp_path: Path) -> None:
    """The square root takes a variable whose sum of squares was changed after it was assigned: a
    norm of the expression would drop the change, so no native op is proposed."""
    report = _diagnosed(tmp_path / "changed.py", "import torch\n"
                                                 "x = torch.zeros(3, 2, requires_grad=True)\n"
                                                 "def f(x):\n"
                                                 "    sq = (x[:, None] - x[None, :]).pow(2).sum(-1)\n"
                                                 f"    {change}\n"
                                                 "    return sq.sqrt().mean()\n"
                                                 "f(x).backward()\n")
    assert report.cls == "B" and [p.kind for p in report.proposals][:1] == ["rule"]


@pytest.mark.parametrize("lines", [
    # What the softmax read is changed in place before the log (a temperature).
    ["    z = w * 1.0", "    p = torch.softmax(z, dim=-1)", "    z.div_(4.0)"],
    # The softmax's input is a model's output: written again on the log's line, the model would
    # run twice (a batch norm's statistics updated twice, a dropout mask drawn anew).
    ["    p = torch.softmax(layer(w), dim=-1)"]])
def test_a_value_that_would_differ_if_computed_again_is_not_looked_through(lines: list[str],
                                                                          tmp_path: Path) -> None:
    """Every original gradient and the loss are not finite here, so the check has nothing to
    compare: the native op must not be offered on a value it would not compute."""
    report = _diagnosed(tmp_path / "again.py", "\n".join([
        "import torch", "w = torch.nn.Parameter(torch.tensor([[0.0, -200.0, 1.0]]))",
        "layer = torch.nn.Identity()", "def f(w):", *lines, "    return -torch.log(p)[0, 1]",
        "f(w).backward()", ""]))
    assert report.cls == "C" and "native" not in [p.kind for p in report.proposals]


@pytest.mark.parametrize("value, again", [
    ("torch.softmax(z, -1)", True), ("F.normalize(z, dim=-1)", True),
    ("z.norm(dim=-1) * float('inf')", True),
    ("self.block.norm(h)", False), ("net.head(x)", False), ("model(x)", False), ("random.gauss(0, 1)", False),
    ("F.dropout(z)", False), ("torch.randn_like(z)", False), ("F.gumbel_softmax(z)", False),
    ("z.exp_()", False)])
def test_what_a_fix_may_compute_again(value: str, again: bool) -> None:
    """torch's own functions and tensor methods may be written again on another line; a model, a
    submodule through ``self``, another module's function, or a draw of random numbers may not."""
    from autograd_groups.doctor.edits import Source, repeatable

    head = "import torch\nimport torch.nn.functional as F\nimport random\nfrom models import net\n"
    text = f"{head}v = {value}\n"
    source = Source("f.py", text.splitlines(True), ast.parse(text))
    assert repeatable(source.tree.body[-1].value) == again


def test_a_check_with_nothing_finite_to_compare_says_so(tmp_path: Path) -> None:
    """A log of a softmax that underflows to 0 at the loss's element: the loss and every gradient
    are not finite, so the native op is checked on finiteness alone, and the check says that; where
    the loss was finite, it says what it compared."""
    text = "\n".join(["import torch", "w = torch.nn.Parameter(torch.tensor([[0.0, -200.0, 1.0]]))",
                      "(-torch.log(torch.softmax(w, dim=-1))[0, {i}]).backward()", ""])
    native = _diagnosed(tmp_path / "nothing.py", text.format(i=1)).proposals[0]
    assert native.kind == "native" and native.checked
    assert native.check.endswith("(the original's were nowhere finite: no value of theirs to compare)")
    finite = _diagnosed(tmp_path / "some.py", "import torch\nw = torch.nn.Parameter(torch.zeros(2))\n"
                        "((w ** 2).sum().sqrt() + w.sum()).backward()\n").proposals[0]
    assert finite.kind == "native" and finite.checked and "nowhere finite" not in finite.check


def test_a_fix_that_changes_the_loss_is_not_checked_though_no_gradient_was_finite() -> None:
    """Behind a singular op at the output every original gradient is NaN, and gradients alone would
    pass any fix: the loss is compared too."""
    from autograd_groups.doctor.check import Baseline, _compare
    from autograd_groups.doctor.session import Backward

    leaf, nan = torch.zeros(3), torch.full((3,), math.nan)
    baseline = Baseline(Backward(1, False, 0), [leaf], [nan], [torch.tensor(1.0)], False)
    assert _compare(baseline, [leaf], [torch.ones(3)], [torch.tensor(1.0)]) is None
    assert _compare(baseline, [leaf], [torch.ones(3)], [torch.tensor(1.5)]) == (
        "changes the loss where it was finite: by up to 0.5 (value of shape ())")


def test_a_vector_divided_by_its_norm_gets_the_native_normalize_checked() -> None:
    native, builtin = report_of("a_masked_direction.py")["proposals"][:2]
    assert (native["kind"], native["checked"]) == ("native", True)
    assert (builtin["kind"], builtin["checked"]) == ("builtin", True)
    assert "+    u = torch.nn.functional.normalize(x, dim=-1)  # born" in native["diff"]
    assert "ag.ops.normalize(x, dim=-1)" in builtin["diff"]


_COMPILES = "the script compiles: the bad step was replayed eagerly"


@pytest.mark.parametrize("backend", ["eager", None])
def test_a_compiled_script_is_said_to_be_replayed_eagerly(backend: str | None, tmp_path: Path) -> None:
    """aot_eager makes a compiled backward (the corpus); the eager backend makes none, and is said
    all the same. A script that compiles nothing gets no such note."""
    script = tmp_path / "compiled.py"
    decorator = f"@torch.compile(backend={backend!r})\n" if backend else ""
    script.write_text("import torch\n"
                      f"{decorator}def rmse(w):\n"
                      "    return (w ** 2).mean().sqrt()\n"
                      "rmse(torch.zeros(3, requires_grad=True)).backward()\n")
    report, _ = diagnose(str(script))
    assert report.cls == "B" and any(_COMPILES in n for n in report.notes) == (backend is not None)
    assert any(_COMPILES in n for n in report_of("b_compiled_distance.py")["notes"])


_PERFECT_FIT = ("import torch\n"
                "def rmse(w):\n"
                "    return (w ** 2).mean().sqrt()\n"
                "rmse(torch.zeros(3, requires_grad=True)).backward()\n")


def test_a_fix_applies_with_git_apply_in_the_folder_the_doctor_ran_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file under the working directory is named as git names it; one elsewhere by its full path."""
    (tmp_path / "train.py").write_text(_PERFECT_FIT)
    monkeypatch.chdir(tmp_path)
    diff = next(p.diff for p in diagnose("train.py")[0].proposals if p.checked)
    assert diff.startswith("--- a/train.py\n+++ b/train.py\n")
    (tmp_path / "fix.diff").write_text(diff)
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "train.py").read_text() == _apply(_PERFECT_FIT, diff) != _PERFECT_FIT
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (tmp_path / "train.py").write_text(_PERFECT_FIT)
    diff = next(p.diff for p in diagnose("../train.py")[0].proposals if p.checked)
    assert diff.startswith(f"--- {tmp_path / 'train.py'}\n+++ {tmp_path / 'train.py'}\n")


def test_a_born_in_the_double_backward_is_reported_at_the_first_order_op() -> None:
    born = report_of("a_gradient_penalty.py")["born"]
    assert born["order"] == 2 and born["op"] == "pow"


@pytest.mark.parametrize("name", CLEAN)
def test_a_run_with_finite_parameter_gradients_is_clean(name: str) -> None:
    report = report_of(name)
    assert report["status"] == "clean" and report["class"] is None and report["born"] is None
    assert report["proposals"] == [] and report["backward_calls"] >= 2


def _apply(text: str, diff: str) -> str:
    """``text`` with the unified ``diff`` applied."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    position = 0
    for hunk in re.split(r"^@@ ", diff, flags=re.M)[1:]:
        start = int(re.match(r"-(\d+)", hunk).group(1))  # type: ignore[union-attr]
        body = hunk.splitlines(keepends=True)[1:]
        out.extend(lines[position:start - 1])
        position = start - 1
        for line in body:
            if line.startswith((" ", "-")):
                assert lines[position] == line[1:], "the diff does not apply"
                position += 1
            if line.startswith((" ", "+")):
                out.append(line[1:])
    return "".join(out + lines[position:])


def _gradients(script: Path, step: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict:
    dumped = tmp_path / f"{script.stem}.pt"
    monkeypatch.setenv("DOCTOR_CORPUS_DUMP", str(dumped))
    monkeypatch.setenv("DOCTOR_CORPUS_STEP", str(step))
    with ag.registry_scope():
        assert run_script(str(script), []) == 0
    return torch.load(dumped)


def test_a_nan_born_inside_a_library_call_is_reported_at_the_users_call() -> None:
    """nn.MultiheadAttention with a fully padded sequence: the NaN is born inside PyTorch's code, the
    line reported is the one that calls it; the forward rewrite that unmasks such a sequence is
    checked, and the rule, which does not make the gradients finite, is not called checked."""
    name = "a_padded_attention.py"
    if not found_here(name):
        return
    report = report_of(name)
    born = report["born"]
    assert (report["class"], born["phase"], born["op"], born["function"], born["incoming"]) == (
        "A", "forward", "multi_head_attention_forward", "encode", "zero")
    assert born["line"] == line_of(str(CORPUS / name), "# born")
    rewrite, rule = report["proposals"][:2]
    assert (rewrite["kind"], rewrite["checked"], rule["kind"]) == ("rewrite", True, "rule")
    unmasked = "key_padding_mask=pad & ~pad.all(-1, keepdim=True))  # born"
    assert f"+    out, _ = attention(x, x, x, {unmasked}" in rewrite["diff"]
    assert not rule["checked"] and rule["check"].startswith("gradients still not finite")


#: Scripts whose class is not A or B that have a checked fix: a native op whose forward is finite.
CHECKED_REWRITES = ["a_padded_attention.py", "c_log_of_softmax.py"]


@pytest.mark.parametrize("name", sorted([*(n for n, f in FOUND.items() if f[0] in "AB"), *CHECKED_REWRITES]))
def test_a_checked_fix_applied_gives_the_original_gradients_where_they_were_finite(
        name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if not found_here(name):
        return
    report = report_of(name)
    checked = [p for p in report["proposals"] if p["checked"]]
    assert checked, [p["check"] for p in report["proposals"]]
    assert all(p["diff"] for p in checked)
    step = report["step"] // BACKWARDS_PER_STEP.get(name, 1)
    original = _gradients(CORPUS / name, step, monkeypatch, tmp_path)
    assert not all(bool(torch.isfinite(g).all()) for g in original.values())
    for i, proposal in enumerate(checked):
        fixed = tmp_path / f"fix{i}" / name
        fixed.parent.mkdir()
        shutil.copy(CORPUS / "dump.py", fixed.parent)
        fixed.write_text(_apply((CORPUS / name).read_text(), proposal["diff"]))
        new = _gradients(fixed, step, monkeypatch, tmp_path)
        for key, old in original.items():
            assert bool(torch.isfinite(new[key]).all()), (proposal["summary"], key)
            kept = torch.isfinite(old)
            torch.testing.assert_close(new[key][kept], old[kept], rtol=1e-4, atol=1e-6)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ["b_rmse_perfect_fit.py", "c_normalize_zero.py"])
def test_anomaly_mode_names_the_node_after_the_birth_where_the_doctor_names_the_birth(name: str) -> None:
    """The advantage over anomaly mode, asked of the running release: a sqrt at 0 makes inf, the
    next node turns it into NaN, and anomaly mode (which looks for NaN) names that next node; a
    0 / 0 born in the forward shows in the backward of a later node. The report names both."""
    script = CORPUS / name
    with pytest.raises(RuntimeError, match=r"Function '(\w+)' returned nan") as raised, \
            torch.autograd.detect_anomaly():
        run_script_raising(script)
    named = re.search(r"Function '(\w+)'", str(raised.value)).group(1)  # type: ignore[union-attr]
    report = report_of(script.name)
    if named == report["born"]["node"]:
        pytest.skip(f"anomaly mode names the birth ({named}) on this release")
    assert report["born"]["node"] == FOUND[name][2]
    assert report["appears"]["node"] == named


def run_script_raising(script: Path) -> None:
    code = compile(script.read_text(), str(script), "exec")
    import sys

    sys.path.insert(0, str(script.parent))
    try:
        exec(code, {"__name__": "__main__", "__file__": str(script)})
    finally:
        sys.path.remove(str(script.parent))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_anomaly_mode_raises_where_the_run_is_clean() -> None:
    script = CORPUS / "clean_erased_nan.py"
    try:
        with torch.autograd.detect_anomaly():
            run_script_raising(script)
    except RuntimeError as e:
        assert "returned nan" in str(e)
    else:
        pytest.skip("anomaly mode does not raise on the erased NaN on this release")
    assert report_of(script.name)["status"] == "clean"


def test_the_command_writes_the_json_and_exits_1_on_a_finding(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.json"
    assert main(["doctor", str(CORPUS / "b_rmse_perfect_fit.py"), "--json", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "class B" in printed and "SqrtBackward0" in printed and "MseLossBackward0" in printed
    assert "  its one element non-finite\n" in printed  # the root of a mean: a 0-d tensor
    written = json.loads(out.read_text())
    assert set(written) >= {"status", "backward_calls", "class", "born", "appears", "proposals"}
    assert written["class"] == "B"
    assert set(written["born"]) >= {"phase", "node", "op", "file", "line", "function", "elements",
                                    "indices", "values", "incoming"}
    assert written["born"]["values"] == {"result": [0.0]}
    assert {"kind", "summary", "diff", "checked", "check"} <= set(written["proposals"][0])


def test_the_command_exits_0_on_a_clean_run(capsys) -> None:
    assert main(["doctor", str(CORPUS / "clean_mlp.py")]) == 0
    assert "final loss" in capsys.readouterr().out


def test_the_command_exits_2_on_usage_errors(tmp_path: Path, capsys) -> None:
    assert main(["doctor", str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    assert main(["doctor", str(CORPUS / "clean_mlp.py"), "--steps", "0"]) == 2
    capsys.readouterr()
    for path in (tmp_path / "no" / "such" / "folder" / "r.json", tmp_path):
        # said before the script runs: nothing of a long run is lost
        assert main(["doctor", str(CORPUS / "clean_mlp.py"), "--json", str(path)]) == 2
        out = capsys.readouterr()
        assert f"cannot write the report to {path}" in out.err and "clean" not in out.out


def test_the_command_passes_on_the_scripts_own_failure(tmp_path: Path, capsys) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit(3)\n")
    out = tmp_path / "report.json"
    assert main(["doctor", str(script), "--json", str(out)]) == 3
    said = capsys.readouterr().err
    assert "failed before any non-finite gradient" in said and "ran no backward pass" not in said
    assert json.loads(out.read_text())["status"] == "clean"  # what was watched before it failed


def test_the_command_says_when_no_backward_ran(tmp_path: Path, capsys) -> None:
    script = tmp_path / "forward.py"
    script.write_text("import torch\nprint(torch.ones(2).sum())\n")
    assert main(["doctor", str(script)]) == 0
    assert "ran no backward pass" in capsys.readouterr().err


def test_a_bad_grad_call_is_diagnosed_and_its_fixes_checked(tmp_path: Path) -> None:
    """``torch.autograd.grad`` asked for one of the leaves its graph reaches: the fixes are checked
    against the gradient it was asked for."""
    script = tmp_path / "asked.py"
    script.write_text("import torch\n"
                      "w = torch.nn.Parameter(torch.ones(3))\n"
                      "x = torch.zeros(3, requires_grad=True)\n"
                      "g, = torch.autograd.grad(((x * w) ** 2).sum().sqrt(), x)\n")
    report, _ = diagnose(str(script))
    assert (report.cls, report.born.node, report.born.line) == ("B", "SqrtBackward0", 4)
    native = report.proposals[0]
    assert native.kind == "native" and native.checked, native.check


@pytest.mark.parametrize("handler", ["except:", "except BaseException:"])
def test_a_script_that_catches_the_stop_is_diagnosed(handler: str, tmp_path: Path) -> None:
    script = tmp_path / "catches.py"
    script.write_text("import torch\n"
                      "x = torch.zeros(4, requires_grad=True)\n"
                      "opt = torch.optim.SGD([x], lr=0.1)\n"
                      "for step in range(3):\n"
                      "    try:\n"
                      "        x.sqrt().sum().backward()\n"
                      "        opt.step()\n"
                      f"    {handler}\n"
                      "        print('failed, going on')\n"
                      "    opt.zero_grad(set_to_none=False)\n")
    report, code = diagnose(str(script))
    assert (report.cls, report.born.node, report.born.line) == ("B", "SqrtBackward0", 6)
    assert report.backward_calls == 1
    assert code == 0 and all(p.checked for p in report.proposals if p.kind == "native")


def test_the_steps_a_script_runs_after_catching_the_stop_are_not_the_bad_steps(tmp_path: Path) -> None:
    """The loop goes on after the stop; a NaN in a later batch is no input of the bad step."""
    report = _diagnosed(tmp_path / "catches.py", "\n".join([
        "import torch", "w = torch.nn.Parameter(torch.zeros(3))",
        "for x in [torch.ones(3), torch.ones(3), torch.tensor([1.0, float('nan'), 1.0])]:",
        "    try:", "        ((w * x) ** 2).sum().sqrt().backward()",
        "    except BaseException:", "        pass", ""]))
    assert (report.cls, report.born.node, report.born.line) == ("B", "SqrtBackward0", 5)


def test_a_script_with_anomaly_mode_on_is_diagnosed(tmp_path: Path) -> None:
    script = tmp_path / "anomalous.py"
    script.write_text("import torch\n"
                      "torch.autograd.set_detect_anomaly(True)\n"
                      "x = torch.zeros(4, requires_grad=True)\n"
                      "x.sqrt().sum().backward()\n")
    report, _ = diagnose(str(script))
    assert (report.cls, report.born.node, report.born.line) == ("B", "SqrtBackward0", 4)
    assert not torch.is_anomaly_enabled()  # the script's mode ends with it


def test_a_fix_to_a_module_the_script_imports_is_checked(tmp_path: Path) -> None:
    """The distance is written in a module of the user's beside the script: each fix changes that
    file, and its check runs the script with the changed module imported in its place."""
    (tmp_path / "geometry.py").write_text("def distance(a, b):\n"
                                          "    return (a - b).pow(2).sum(-1).sqrt()\n")
    script = tmp_path / "train.py"
    script.write_text("import torch\n"
                      "from geometry import distance\n"
                      "w = torch.nn.Parameter(torch.ones(4, 2))\n"
                      "distance(w, w.detach()).sum().backward()\n")
    report, _ = diagnose(str(script))
    assert (report.cls, report.born.file, report.born.line) == ("B", str(tmp_path / "geometry.py"), 2)
    fixes = {p.kind: p for p in report.proposals}
    # The module never imported torch: the native op's fix imports it.
    assert "+import torch\n" in fixes["native"].diff
    assert "+    return torch.linalg.vector_norm(a - b, dim=-1)" in fixes["native"].diff
    assert all(fixes[kind].checked for kind in ("native", "builtin", "rule")), \
        [p.check for p in report.proposals]
    # Four distances of sqrt(1e-12) move the loss from 0 to 4e-6.
    assert fixes["rewrite"].check.startswith(
        "at the bad step: changes the loss where it was finite: by up to 4e-06")
    assert "geometry" not in sys.modules  # each run imported it anew, and forgot it


def test_a_package_installed_in_the_scripts_folder_is_not_imported_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A virtual environment inside the project's folder: its packages are not the user's (an
    extension module cannot be imported twice in one process), and stay imported."""
    from autograd_groups.doctor import modules

    (tmp_path / "installed_here.py").write_text("value = 1\n")
    (tmp_path / "mine.py").write_text("value = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(modules, "is_users", lambda file: not file.endswith("installed_here.py"))
    with modules.fresh(str(tmp_path)):
        import installed_here  # noqa: F401
        import mine  # noqa: F401
    assert "installed_here" in sys.modules and "mine" not in sys.modules
    del sys.modules["installed_here"]


_ANNOTATED = "def f(x: int) -> None: ...\nassert f.__annotations__['x'] is int, f.__annotations__\n"


def test_a_changed_copy_keeps_its_annotations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed script and a changed module run as Python would run them: not with the library's
    own ``from __future__ import annotations``, which made every annotation a string (a dataclass's
    field types, read by argparse, were then not callable)."""
    from autograd_groups.doctor import modules

    script = tmp_path / "train.py"
    script.write_text("")
    assert run_script(str(script), [], source=_ANNOTATED) == 0
    (tmp_path / "annotated.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with modules.fresh(str(tmp_path), {str(tmp_path / "annotated.py"): _ANNOTATED}):
        import annotated  # noqa: F401


def test_a_changed_package_init_keeps_its_relative_imports(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A fix to a package's ``__init__.py`` is checked with the package's folder kept, so that its
    relative imports still work."""
    from autograd_groups.doctor import modules

    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .part import value\n")
    (package / "part.py").write_text("value = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    changed = {str(package / "__init__.py"): "from .part import value\nvalue += 1\n"}
    with modules.fresh(str(tmp_path), changed):
        import mypkg
        assert mypkg.value == 2


def test_a_modules_state_starts_over_in_each_run(tmp_path: Path) -> None:
    """A module of the user's keeps a count at its top level, which the script's steps advance: the
    replay imports it anew, as a new process would, and the bad step goes bad again (it was class G
    when the replay found the count already advanced)."""
    (tmp_path / "state.py").write_text("seen = []\n")
    script = tmp_path / "train.py"
    script.write_text("import torch\n"
                      "from state import seen\n"
                      "w = torch.nn.Parameter(torch.ones(3))\n"
                      "for step in range(6):\n"
                      "    x = w * (0.0 if len(seen) == 3 else 1.0)\n"
                      "    seen.append(step)\n"
                      "    x.sqrt().sum().backward()\n")
    report, _ = diagnose(str(script))
    assert (report.step, report.cls, report.born.node, report.born.line) == (4, "B", "SqrtBackward0", 7)


def test_in_a_training_loop_function_the_rule_goes_around_the_statement(tmp_path: Path) -> None:
    """A group's outputs are what its function returns: on ``main()``, which returns nothing and
    runs the backward, a group would hold no computation. The statement gets it, and it works."""
    script = tmp_path / "loop.py"
    script.write_text("import torch\n"
                      "def main():\n"
                      "    x = torch.zeros(5, requires_grad=True)\n"
                      "    opt = torch.optim.SGD([x], lr=0.1)\n"
                      "    for i in range(2):\n"
                      "        opt.zero_grad()\n"
                      "        loss = (x ** 2).sum().sqrt()\n"
                      "        loss.backward()\n"
                      "        opt.step()\n"
                      "main()\n")
    report, _ = diagnose(str(script))
    rule = next(p for p in report.proposals if p.kind == "rule")
    assert "+        with ag.autograd_group(\"loss\"):" in rule.diff and "@ag.autograd_group" not in rule.diff
    # The replay passes, but ag.verify checks a group around a statement through a function only:
    # the rule is not called checked.
    assert "gradients finite, equal to the original's" in rule.check and not rule.checked
    assert "ag.verify did not check the rule (first order): a group around a statement" in rule.check


def test_a_statement_that_runs_the_backward_gets_its_loss_grouped_before_it(tmp_path: Path) -> None:
    """A group's rules are set when its block ends: around ``E.backward()`` the backward would run
    inside the block, before them. The loss is computed in the block, and its backward after."""
    script = tmp_path / "oneline.py"
    script.write_text("import torch\n"
                      "w = torch.nn.Parameter(torch.zeros(3))\n"
                      "loss = 1.0\n"
                      "(w * 2).sqrt().sum().backward()\n")
    report, _ = diagnose(str(script))
    rule = next(p for p in report.proposals if p.kind == "rule")
    split = '+with ag.autograd_group("loss1"):\n+    loss1 = (w * 2).sqrt().sum()\n+loss1.backward()'
    assert split in rule.diff
    assert "gradients finite, equal to the original's" in rule.check


def test_a_lambda_is_wrapped_where_it_is_defined(tmp_path: Path) -> None:
    """A with block around a lambda's definition would hold nothing: the lambda is the group."""
    script = tmp_path / "lam.py"
    script.write_text("import torch\n"
                      "w = torch.nn.Parameter(torch.zeros(3))\n"
                      "rms = lambda v: (v ** 2).mean().sqrt()\n"
                      "rms(w).backward()\n")
    report, _ = diagnose(str(script))
    rule = next(p for p in report.proposals if p.kind == "rule")
    assert '+rms = ag.autograd_group("rms")(lambda v: (v ** 2).mean().sqrt())' in rule.diff
    assert rule.checked, rule.check


def test_a_fix_in_a_file_with_its_own_ag_imports_the_library_by_its_full_name(tmp_path: Path) -> None:
    script = tmp_path / "named.py"
    script.write_text("import torch\n"
                      "ag = 'mean'\n"
                      "def rmse(v):\n"
                      "    return (v ** 2).mean().sqrt() if ag == 'mean' else v.abs().sum()\n"
                      "w = torch.nn.Parameter(torch.zeros(4))\n"
                      "rmse(w).backward()\n")
    report, _ = diagnose(str(script))
    fixes = [p for p in report.proposals if p.kind in ("builtin", "rule")]
    assert fixes and all("+import autograd_groups\n" in p.diff and " as ag" not in p.diff for p in fixes)
    assert all(p.checked for p in fixes if p.kind != "rule"), [p.check for p in fixes]


def test_an_infinity_the_script_makes_of_its_data_is_born_at_the_op(tmp_path: Path) -> None:
    """The log of a zero count in preprocessing, which a layer then takes: born at the log, which
    the watched step ran (the padded-attention scripts keep their additive -inf mask as meant:
    class A)."""
    script = tmp_path / "counts.py"
    script.write_text("import torch\n"
                      "counts = torch.tensor([[1.0, 2.0], [0.0, 3.0]])\n"
                      "x = torch.log(counts)\n"
                      "model = torch.nn.Linear(2, 1)\n"
                      "loss = model(x).sum()\n"
                      "loss.backward()\n")
    report, _ = diagnose(str(script))
    assert (report.cls, report.born.op, report.born.line) == ("C", "log", 3)
    assert not found_here("a_padded_attention.py") or report_of("a_padded_attention.py")["class"] == "A"


@pytest.mark.parametrize("loss, line", [
    ("torch.nn.functional.mse_loss(model(x).squeeze(1), y)", "y = torch.tensor([1.0, float('inf')])"),
    ("((model(x).squeeze(1) - y) ** 2).mean()", "y = torch.tensor([1.0, float('inf')])"),
    ("((model(x).squeeze(1) - y) ** 2).mean()", "y = torch.tensor([1.0, float('-inf')])"),
    ("(model.weight * y).sum()", "y = torch.tensor([1.0, float('-inf')])"),
])
def test_an_infinity_in_a_target_or_a_factor_is_class_e(loss: str, line: str, tmp_path: Path) -> None:
    """A label of +-inf, or a -inf a parameter is multiplied by, is data gone bad (E); only a -inf
    that is added (a mask, as in the corpus's additive masks) is taken as meant."""
    report = _diagnosed(tmp_path / "labels.py", "import torch\n"
                        "model = torch.nn.Linear(2, 1)\n"
                        "x = torch.ones(2, 2)\n"
                        f"{line}\n"
                        f"loss = {loss}\n"
                        "loss.backward()\n")
    assert (report.cls, report.born.line) == ("E", 5)
    assert report_of("a_masked_logsumexp.py")["class"] == "A"


def test_steps_stops_watching(tmp_path: Path) -> None:
    report, _ = diagnose(str(CORPUS / "clean_mlp.py"), steps=2)
    assert report.status == "clean" and report.backward_calls == 2


def test_the_optimizer_step_that_makes_parameters_non_finite_is_class_f(tmp_path: Path) -> None:
    script = tmp_path / "blowup.py"
    script.write_text(
        "import torch\n"
        "w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))\n"
        "opt = torch.optim.SGD([w], lr=1e38)\n"
        "for _ in range(3):\n"
        "    loss = (w * w).sum()\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n")
    report, _ = diagnose(str(script))
    assert report.cls == "F" and report.step == 2
    assert not any("updates its parameters itself" in n for n in report.notes)


_MANUAL_STEP = ("import torch\n"
                "w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))\n"
                "for _ in range(3):\n"
                "    (w * w).sum().backward()\n"
                "    with torch.no_grad():\n"
                "        w -= 1e38 * w.grad\n"
                "    w.grad = None\n")


def test_a_parameter_the_scripts_own_update_made_non_finite_is_e_with_a_note_on_f(tmp_path: Path) -> None:
    """No torch.optim step to see: the parameter is non-finite at the step's start (E), and the note
    says what it is if the script's own update did it; not where the data brought the infinity."""
    report = _diagnosed(tmp_path / "manual.py", _MANUAL_STEP)
    assert (report.cls, report.step, report.born.op) == ("E", 2, "mul")
    assert [n for n in report.notes if "updates its parameters itself (p -= lr * p.grad)" in n]
    with ag.doctor() as in_process:
        exec(compile(_MANUAL_STEP, "manual.py", "exec"), {})
    assert in_process.cls == "E" and in_process.notes == report.notes
    data = _diagnosed(tmp_path / "data.py", "import torch\n"
                      "w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))\n"
                      "for x in (torch.ones(2), torch.tensor([1.0, float('inf')])):\n"
                      "    (w * x).sum().backward()\n"
                      "    w.grad = None\n")
    assert data.cls == "E" and not data.notes


def test_a_nan_that_does_not_recur_in_the_replay_is_class_g(tmp_path: Path) -> None:
    """The script goes bad on its first run only: it leaves a file behind, which the replay finds
    (state outside the process, which the doctor cannot reset)."""
    script = tmp_path / "flaky.py"
    script.write_text(
        "import pathlib, torch\n"
        "mark = pathlib.Path(__file__).with_name('ran')\n"
        "x = torch.tensor([1.0 if mark.exists() else 0.0], requires_grad=True)\n"
        "mark.touch()\n"
        "x.sqrt().sum().backward()\n")
    report, _ = diagnose(str(script))
    assert report.status == "found" and report.cls == "G" and report.born is None


def test_in_process_the_report_is_the_same_object_and_says_its_fixes_are_unchecked() -> None:
    x = torch.zeros(3, requires_grad=True)
    with ag.doctor() as report:
        for shift in (1.0, 0.0):
            (x + shift).sqrt().sum().backward()  # born here
    assert report.status == "found" and report.step == 2 and report.cls == "B"
    assert report.born is not None and report.born.node == "SqrtBackward0"
    assert report.born.line == line_of(__file__, "# born here")
    assert report.proposals and not any(p.checked for p in report.proposals)
    assert "cannot be replayed" in report.proposals[0].check


def test_in_process_a_birth_at_second_order_is_the_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gradient penalty's first backward builds a graph; the NaN is born in the second, and is
    told at the first-order op and line, as the command tells it."""
    monkeypatch.syspath_prepend(str(CORPUS))
    with ag.doctor() as report:
        run_script_raising(CORPUS / "a_gradient_penalty.py")
    born, command = report.born, report_of("a_gradient_penalty.py")["born"]
    assert born is not None and (born.node, born.line, born.function, born.order) == (
        command["node"], command["line"], command["function"], 2)


def test_in_process_a_finite_block_is_clean() -> None:
    x = torch.ones(3, requires_grad=True)
    with ag.doctor() as report:
        x.sqrt().sum().backward()
    assert report.status == "clean" and report.backward_calls == 1


_SCALED_STEPS = (
    "import torch\n"
    "w = torch.nn.Parameter(torch.full((2,), 1e-10))\n"
    "opt = torch.optim.SGD([w], lr=1e-40)\n"
    "scaler = torch.amp.GradScaler('cpu')\n"
    "for _ in range(12):\n"
    "    loss = {loss}\n"
    "    opt.zero_grad()\n"
    "    scaler.scale(loss).backward()\n"
    "    scaler.step(opt)\n"
    "    scaler.update()\n")


def test_a_loss_scalers_deliberate_overflow_is_no_finding(tmp_path: Path) -> None:
    script = tmp_path / "scaled.py"
    script.write_text(_SCALED_STEPS.format(loss="(w * 1e34).sum()"))  # inf at scale 2**16 only
    report, _ = diagnose(str(script))
    assert report.status == "clean" and report.backward_calls == 12 and report.notes == []


def test_a_loss_scaler_started_high_may_overflow_more_than_five_times(tmp_path: Path) -> None:
    """init_scale 2**70 and gradients of 1e20: nine halvings before the scaled gradient is finite."""
    script = tmp_path / "scaled.py"
    script.write_text(_SCALED_STEPS.format(loss="(w * 1e20).sum()").replace(
        "GradScaler('cpu')", "GradScaler('cpu', init_scale=2.0 ** 70)"))
    report, _ = diagnose(str(script))
    assert report.status == "clean" and report.backward_calls == 12 and report.notes == []


def test_a_run_that_ends_in_skipped_overflows_says_a_nan_may_be_untold(tmp_path: Path) -> None:
    """A real NaN under a scaler started at 2**70: twelve steps end before the scale is down."""
    script = tmp_path / "scaled.py"
    script.write_text(_SCALED_STEPS.format(loss="(w - 1e-10).sqrt().sum()").replace(
        "GradScaler('cpu')", "GradScaler('cpu', init_scale=2.0 ** 70)"))
    report, _ = diagnose(str(script))
    assert report.status == "clean"
    assert report.notes and "the last 12 step(s) overflowed" in report.notes[0]


def test_a_loss_scaler_that_keeps_overflowing_is_a_finding(tmp_path: Path) -> None:
    script = tmp_path / "scaled.py"
    script.write_text(_SCALED_STEPS.format(loss="(w - 1e-10).sqrt().sum()"))
    report, _ = diagnose(str(script))
    assert report.status == "found" and report.cls == "B" and report.step == 5
    assert report.born is not None and report.born.node == "SqrtBackward0"


_ACCUMULATED = (
    "import torch\n"
    "w = torch.nn.Parameter(torch.full((2,), 1e-10))\n"
    "opt = torch.optim.SGD([w], lr=1e-40)\n"
    "scaler = torch.amp.GradScaler('cpu')\n"
    "for _ in range(12):\n"
    "    opt.zero_grad()\n"
    "    for loss in {losses}:\n"
    "        scaler.scale(loss(w)).backward()\n"
    "    scaler.step(opt)\n"
    "    scaler.update()\n")


def test_a_loss_scaler_counts_its_steps_not_the_backward_passes_between(tmp_path: Path) -> None:
    """Micro-batches: a finite one before the bad one in every step does not end the run of
    overflowing steps, and six that overflow in one step are one step the scaler skipped."""
    script = tmp_path / "scaled.py"
    bad = "lambda w: ((w - 1e-10) ** 2).sum().sqrt()"
    script.write_text(_ACCUMULATED.format(losses=f"[lambda w: w.sum(), {bad}]"))
    report, _ = diagnose(str(script))
    assert (report.status, report.cls, report.step) == ("found", "B", 10)  # the fifth step's second pass
    assert report.notes[0].startswith("the fixes are checked at backward pass 2, the first of")
    native = report.proposals[0]
    assert native.kind == "native" and native.checked, native.check
    script.write_text(_ACCUMULATED.format(losses="[lambda w: (w * 1e34).sum()] * 6"))  # inf at 2**16 only
    report, _ = diagnose(str(script))
    assert report.status == "clean" and report.backward_calls == 72 and report.notes == []


def test_each_loss_scaler_counts_its_own_steps(tmp_path: Path) -> None:
    """A GAN with a scaler per model: the critic's finite steps do not end the generator's run of
    overflows."""
    report = _diagnosed(
        tmp_path / "scalers.py",
        "import torch\n"
        "d, g = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.zeros(3))\n"
        "opt_d, opt_g = torch.optim.SGD([d], lr=0.1), torch.optim.SGD([g], lr=0.1)\n"
        "scaler_d, scaler_g = torch.amp.GradScaler('cpu'), torch.amp.GradScaler('cpu')\n"
        "for step in range(8):\n"
        "    opt_d.zero_grad()\n"
        "    scaler_d.scale((d * 2).sum()).backward()\n"
        "    scaler_d.step(opt_d)\n"
        "    scaler_d.update()\n"
        "    opt_g.zero_grad()\n"
        "    scaler_g.scale(g.pow(2).sum().sqrt()).backward()\n"
        "    scaler_g.step(opt_g)\n"
        "    scaler_g.update()\n")
    assert (report.status, report.cls, report.step) == ("found", "B", 10)
    assert report.notes[0].startswith("the fixes are checked at backward pass 2, the first of")


def test_a_disabled_loss_scaler_skips_no_step(tmp_path: Path) -> None:
    """``GradScaler(enabled=False)`` (the usual switch under bfloat16) hands the loss back and steps
    the optimizer: the first bad backward is the finding."""
    text = _SCALED_STEPS.format(loss="(w - 1e-10).sqrt().sum()")
    disabled = text.replace("GradScaler('cpu')", "GradScaler('cpu', enabled=False)")
    report = _diagnosed(tmp_path / "scaled.py", disabled)
    assert (report.status, report.cls, report.step, report.notes) == ("found", "B", 1, [])


def test_fixes_under_a_loss_scaler_are_checked_at_the_first_step_it_skipped(tmp_path: Path) -> None:
    """The scaler skips the five overflow steps of a real NaN; a fixed script takes them, so its
    weights differ at the fifth, and its fixes are compared at the first."""
    script = tmp_path / "scaled.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "w = torch.nn.Parameter(torch.randn(3))\n"
        "anchor = torch.nn.Parameter(torch.zeros(3))\n"
        "opt = torch.optim.SGD([w, anchor], lr=0.1)\n"
        "scaler = torch.amp.GradScaler('cpu')\n"
        "for _ in range(8):\n"
        "    loss = (w ** 2).sum() + ((anchor - torch.zeros(3)) ** 2).sum().sqrt()\n"
        "    opt.zero_grad()\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n")
    report, _ = diagnose(str(script))
    assert (report.status, report.cls, report.step) == ("found", "B", 5)
    assert report.notes == ["the fixes are checked at backward pass 1, the first of the loss scaler's "
                            "overflows up to 5: it skipped their steps, so a fixed script's weights "
                            "differ from the original's after it"]
    native = report.proposals[0]
    assert native.kind == "native" and "torch.linalg.vector_norm" in native.diff
    assert native.checked and native.check.startswith("backward pass 1 replayed: gradients finite")


def test_the_demos_nan_is_diagnosed_with_a_checked_fix() -> None:
    """``make demo`` runs the doctor on examples/triplet_nan.py: the demo's plain-composite NaN."""
    script = Path(__file__).resolve().parents[1] / "examples" / "triplet_nan.py"
    report, _ = diagnose(str(script), ["--steps", "3"])
    assert report.status == "found" and report.cls == "A" and report.step == 1
    assert report.born is not None and (report.born.node, report.born.function) == (
        "SqrtBackward0", "pairwise_distance")
    native = report.proposals[0]
    assert native.kind == "native" and native.checked and "torch.linalg.vector_norm" in native.diff


def test_a_distributed_script_is_diagnosed_in_one_process(tmp_path: Path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, world_size=1)\n"
        "x = torch.zeros(2, requires_grad=True)\n"
        "x.sqrt().sum().backward()\n")
    report, _ = diagnose(str(script))
    assert report.cls == "B" and "one process was diagnosed: rank 0 of 1" in report.notes[0]


def _spread(values: list[float], size: int = 1000, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``size`` ones with ``values`` spread through them."""
    t = torch.ones(size, dtype=dtype)
    t[torch.linspace(0, size - 1, len(values)).long()] = torch.tensor(values, dtype=dtype)
    return t


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("groups", [
    [[_spread([NAN])], [torch.ones(3)]],
    [[torch.tensor(2.0)], [_spread([INF]), torch.ones(4)]],
    [[torch.tensor(2.0)], [_spread([-INF])]],
    [[torch.tensor(2.0)], [_spread([INF, -INF])]],  # its sum is NaN
    [[torch.tensor(INF)], [_spread([-INF])]],  # the sums' sum is NaN
    [[torch.tensor(1.0)], [_spread([3e38, 3e38])]],  # the sum overflows: all finite
    [[torch.tensor(1.0)], [_spread([6e4, 6e4], dtype=torch.float16)]],
    [[torch.tensor(1.0)], [_spread([6e4, INF], dtype=torch.float16), torch.ones(2, dtype=torch.float64)]],
    [[torch.tensor(1.0)], [torch.tensor([1.0, complex(0, INF)])]],
    [[torch.tensor(1.0)], [torch.tensor([1e38, 1e38]) * (1 + 1j), torch.arange(3)], [_spread([1e38])]],
    [[torch.tensor(NAN, requires_grad=True)], [torch.ones(2)], [torch.zeros(0)]],
    # An embedding's sparse gradient (nn.Embedding(sparse=True)), finite and not.
    [[torch.tensor(1.0)], [_spread([NAN]).reshape(100, 10).to_sparse()], [torch.ones(3, 2).to_sparse()]],
    [[torch.tensor(1.0)], [_spread([3e38, 3e38]).reshape(100, 10).to_sparse_csr()]],
])
def test_the_trigger_says_exactly_which_groups_are_finite(groups: list[list[torch.Tensor]]) -> None:
    native = [all(bool(torch.isfinite(t.to_dense()).all()) for t in group) for group in groups]
    assert finite_groups(groups) == native


def test_the_watch_keeps_the_gradients_of_the_backward_that_ends_the_script_and_of_no_other() -> None:
    w = torch.ones(3, requires_grad=True)
    with Session(stops=False).installed():
        (w * 2).sum().backward()
        earlier = weakref.ref(w.grad)
        w.grad = None
        assert earlier() is None  # nothing of the watch's holds it
    session = Session(stop_at=2)
    with pytest.raises(Stop), session.installed():
        for _ in range(3):
            (w * 3).sum().backward()
    assert len(session.last_leaves) == 1 and session.last_leaves[0] is w
    # a copy: a script that catches the Stop may zero its gradients in place
    assert session.last_grads[0] is not w.grad and torch.equal(session.last_grads[0], w.grad)
    assert w.grad.tolist() == [6.0, 6.0, 6.0]


def test_a_long_run_keeps_no_record_per_backward() -> None:
    # The watch runs for as many steps as the script takes to go bad: it keeps the first bad
    # backward, the last two and counts, not one record per backward.
    def records() -> int:
        gc.collect()
        return sum(type(o) is Backward for o in gc.get_objects())

    w = torch.ones(3, requires_grad=True)
    session, before = Session(stops=False), records()
    with session.installed():
        for i in range(2000):
            (w * (math.nan if i == 1500 else 1.0)).sum().backward()
    assert records() - before == 3 and session.count == 2000
    assert session.bad is not None and session.bad.index == 1501
    assert session.last is not None and session.last.index == 2000 and session.before_last.index == 1999

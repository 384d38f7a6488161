"""PyTorch's internals are reached through one module, autograd_groups/compat.py, which finds them on
the installed release and says clearly where one is missing."""

from __future__ import annotations

import ast
import sys
import threading
from pathlib import Path

import pytest
import torch

import autograd_groups as ag
from autograd_groups import compat
from autograd_groups.errors import GroupError, UnsupportedRelease

PACKAGE = Path(__file__).resolve().parent.parent / "autograd_groups"
PRIVATE = ("torch._C", "torch._functorch", "torch._dynamo", "torch._disable_dynamo")


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _private_uses(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str | None] = []
        if isinstance(node, ast.Attribute):
            names = [_dotted(node)]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found += [f"{path.relative_to(root)}:{node.lineno}: {name}" for name in names
                  if name and name.startswith(PRIVATE)]
    return found


def test_private_torch_names_only_in_compat() -> None:
    uses = [use for path in sorted(PACKAGE.rglob("*.py")) if path.name != "compat.py"
            for use in _private_uses(path)]
    assert uses == []


def test_the_scan_sees_a_private_use(tmp_path: Path) -> None:
    """The check above can fail: it finds each form of a private reference, and no prose."""
    sample = tmp_path / "sample.py"
    sample.write_text("import torch\nfrom torch._C._functorch import peek_interpreter_stack\n"
                      "import torch._dynamo\nx = torch._C._current_graph_task_id()\n"
                      "y = 'torch._C in a string is prose'\n")
    found = {use.split(": ")[1] for use in _private_uses(sample, tmp_path)}
    assert found == {"torch._C._functorch", "torch._dynamo", "torch._C", "torch._C._current_graph_task_id"}


def test_a_missing_internal_raises_naming_feature_and_release() -> None:
    missing = compat.find(torch._C, "_not_in_any_release", "the backward-scoped flag")
    with pytest.raises(UnsupportedRelease) as caught:
        missing()
    message = str(caught.value)
    assert message.startswith("the backward-scoped flag needs torch._C._not_in_any_release, which "
                              f"PyTorch {torch.__version__} does not have")
    assert "2.11 to 2.15" in message
    assert isinstance(caught.value, GroupError) and ag.UnsupportedRelease is UnsupportedRelease


def test_a_present_internal_is_the_torch_function() -> None:
    assert compat.find(torch._C, "_current_graph_task_id", "x") is torch._C._current_graph_task_id


@pytest.mark.parametrize("unstash", [compat.unstash_from_engine_tls, compat._unstash_by_none],
                         ids=["this release", "2.11 form"])
def test_engine_tls_set_and_unset(unstash) -> None:
    key = "autograd_groups.test"
    assert compat.stashed_in_engine_tls(key) is None
    compat.stash_in_engine_tls(key, {"on": False})
    assert compat.stashed_in_engine_tls(key) == {"on": False}
    unstash(key)
    assert compat.stashed_in_engine_tls(key) is None


def test_stashing_keeps_reference_counts_balanced() -> None:
    """torch 2.11's stash takes no reference but drops one when the entry is replaced: uncorrected,
    each block of the backward-scoped flag freed a state Python still used (a segmentation fault)."""

    class State:
        pass

    state, key = State(), "autograd_groups.test"
    before = sys.getrefcount(state)
    for _ in range(50):
        compat.stash_in_engine_tls(key, state)
        assert compat.stashed_in_engine_tls(key) is state
        compat.unstash_from_engine_tls(key)
    assert sys.getrefcount(state) == before


def test_backward_scope_in_threads_that_exit() -> None:
    """Each thread scopes its own backward pass, then exits: on 2.11, whose engine state cannot
    erase a key, the scope must still close, and the thread's exit must not crash the process."""
    points = torch.tensor([[0.0, 1.0], [0.0, 1.0], [2.0, 3.0]])
    x = points.clone().requires_grad_()
    ag.ops.cdist(x, x).sum().backward()
    expected = x.grad
    assert torch.isfinite(expected).all()
    after: list[torch.Tensor] = []

    def work() -> None:
        mine = points.clone().requires_grad_()
        with ag.special_cases(False, during="backward"):
            ag.ops.cdist(mine, mine).sum().backward()
        mine.grad = None
        ag.ops.cdist(mine, mine).sum().backward()  # the scope is over: the rule applies again
        after.append(mine.grad)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(after) == 8
    for grad in after:
        torch.testing.assert_close(grad, expected)

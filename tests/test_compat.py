"""PyTorch's internals are reached through one module, autograd_groups/compat.py, which finds them on
the installed release and says clearly where one is missing."""

from __future__ import annotations

import ast
import os
import pkgutil
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import autograd_groups as ag
from autograd_groups import compat
from autograd_groups.errors import GroupError, UnsupportedRelease

PACKAGE = Path(__file__).resolve().parent.parent / "autograd_groups"
#: A private name of torch, or of a module under it, as dotted or path text (``torch._C``,
#: ``torch.utils._pytree``, ``torch/_functorch/eager_transforms.py``).
PRIVATE_PATH = re.compile(r"\btorch(?:[./\\]\w+)*?[./\\]_(?!_)")
#: The private modules and names of torch, which a string can name on its own
#: (``os.path.join("torch", "_functorch", ...)``, ``getattr(torch, "_disable_dynamo")``).
PRIVATE_PARTS = frozenset(
    name for name in (*(m.name for m in pkgutil.iter_modules([*torch.__path__, *torch.utils.__path__])),
                      *dir(torch), *dir(torch.utils))
    if name.startswith("_") and not name.startswith("__"))


def _private_members() -> frozenset[str]:
    """The private members of the torch objects the package handles, asked of the running release:
    of a tensor and a view, and autograd nodes (``_base``, ``_version``, ``_sequence_nr``,
    ``_input_metadata``, ``_saved_self``, ...); of an op overload and its packet, those of its schema
    and overloads (``_schema``): its others (``_name``, ``_op``) are words the package's own classes
    use for their attributes."""
    x = torch.ones(2, requires_grad=True)
    node = x.pow(3).grad_fn
    assert node is not None
    ops = (torch.ops.aten.pow.Tensor_Scalar, torch.ops.aten.pow)
    names = ({name for o in (x, x[1:], node, node.next_functions[0][0]) for name in dir(o)}
             | {name for o in ops for name in dir(o) if "schema" in name or "overload" in name})
    return frozenset(name for name in names if name.startswith("_") and not name.startswith("__"))


PRIVATE_MEMBERS = _private_members()
#: What autograd's generated node classes save, each class its own names: ``_saved_<name>`` and for a
#: tensor ``_raw_saved_<name>``, read as an attribute or built as a string for ``getattr``.
SAVED_MEMBER = re.compile(r"^_(raw_)?saved_\w*$")


def _private_member(name: str) -> bool:
    return name in PRIVATE_MEMBERS or bool(SAVED_MEMBER.match(name))


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _private_name(name: str | None) -> bool:
    """Whether a dotted name, or a string without spaces, names something private of torch: prose
    (a message that mentions ``torch._dynamo.config``) has spaces, a reference has none."""
    if not name or any(c.isspace() for c in name):
        return False
    return bool(PRIVATE_PATH.search(name)) or name in PRIVATE_PARTS


def _aliases(tree: ast.AST) -> dict[str, str]:
    """The names a module binds to torch's modules: ``fa`` of ``import torch.autograd.forward_ad as
    fa``, ``forward_ad`` of ``from torch.autograd import forward_ad``."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {a.asname: a.name for a in node.names if a.asname and a.name.startswith("torch.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            bound |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    return bound


def _resolved(name: str | None, aliases: dict[str, str]) -> str | None:
    if name is None:
        return None
    head, _, rest = name.partition(".")
    return f"{aliases[head]}.{rest}" if head in aliases and rest else name


def _private_uses(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    found = []
    tree = ast.parse(path.read_text())
    aliases = _aliases(tree)
    for node in ast.walk(tree):
        names: list[str | None] = []
        member = (node.attr if isinstance(node, ast.Attribute) else
                  node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else "")
        if _private_member(member):
            found.append(f"{path.relative_to(root)}:{node.lineno}: .{member}")
        elif isinstance(node, ast.Attribute):
            names = [_resolved(_dotted(node), aliases)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        found += [f"{path.relative_to(root)}:{node.lineno}: {name}" for name in names if _private_name(name)]
    return found


def test_private_torch_names_only_in_compat() -> None:
    uses = [use for path in sorted(PACKAGE.rglob("*.py")) if path.name != "compat.py"
            for use in _private_uses(path)]
    assert uses == []


def test_the_scan_sees_a_private_use(tmp_path: Path) -> None:
    """The check above can fail: it finds each form of a private reference, and no prose."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, sys, torch\nfrom torch._C._functorch import peek_interpreter_stack\n"
        "import torch._dynamo\nx = torch._C._current_graph_task_id()\n"
        "from torch.utils._pytree import tree_flatten\nimport torch.utils._pytree\n"
        "from torch import _dynamo\nflag = torch.compiler._is_exporting_flag\n"
        "path = os.path.join('torch', '_functorch', 'eager_transforms.py')\n"
        "where = 'torch/_functorch/eager_transforms.py'\nloaded = sys.modules['torch._dynamo']\n"
        "off = getattr(torch, '_disable_dynamo')\n"
        "y = 'torch._C in a string is prose'\nz = 'torch.utils.checkpoint is public, _x is not torch'\n"
        "public = os.path.join('torch', 'autograd', '__init__.py')\n"
        "import torch.autograd.forward_ad as fa\nfrom torch.autograd import forward_ad\n"
        "level = fa._current_level + forward_ad._current_level + fa.dual_level().__enter__()\n")
    uses = _private_uses(sample, tmp_path)
    # each reference, no prose and no public name of a module bound to a name of its own
    assert {int(use.split(":")[1]) for use in uses} == {*range(2, 13), 18}
    assert {use.split(": ")[1] for use in uses} == {
        "torch._C._functorch", "torch._C._functorch.peek_interpreter_stack", "torch._dynamo",
        "torch._C", "torch._C._current_graph_task_id", "torch.utils._pytree",
        "torch.utils._pytree.tree_flatten", "torch.compiler._is_exporting_flag", "_functorch",
        "torch/_functorch/eager_transforms.py", "_disable_dynamo",
        "torch.autograd.forward_ad._current_level"}


def test_the_scan_sees_a_private_member_of_a_torch_object(tmp_path: Path) -> None:
    """Private members of tensors, nodes and ops count too: read as attributes, or named in strings
    for ``getattr``; the package's own private names, and public members, do not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(node, grad, overload, name, self):\n"
        "    a = node._saved_self, node._raw_saved_self, node._sequence_nr(), node._input_metadata\n"
        "    b = grad._base, grad._version, overload._schema.arguments\n"
        "    c = getattr(node, '_saved_' + name), getattr(node, '_saved_exponent', None)\n"
        "    d = hasattr(node, '_raw_saved_' + name)\n"
        "    e = _saved_values(node), _saved_by_class, node.metadata, grad.is_contiguous()\n"
        "    return self._cache, node.name(), 'saved values are read here'\n")
    uses = _private_uses(sample, tmp_path)
    assert sorted(use.split(":", 1)[1] for use in uses) == [
        "2: ._input_metadata", "2: ._raw_saved_self", "2: ._saved_self", "2: ._sequence_nr",
        "3: ._base", "3: ._schema", "3: ._version", "4: ._saved_", "4: ._saved_exponent",
        "5: ._raw_saved_"]


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


def test_the_dual_level_is_read_on_this_release() -> None:
    """The table in docs/reliability.md says every supported release has it."""
    assert isinstance(torch.autograd.forward_ad._current_level, int)
    with torch.autograd.forward_ad.dual_level():
        assert compat.dual_level() == 0
    assert compat.dual_level() == -1


def test_accumulate_grad_read_through_the_public_graph() -> None:
    assert compat.ACCUMULATE_GRAD is torch._C._functions.AccumulateGrad


def test_grad_transform_codes_are_functorch_own() -> None:
    from torch._functorch import eager_transforms

    impl, inner = compat.grad_transform_codes()
    assert impl is eager_transforms.grad_and_value_impl.__wrapped__.__code__
    assert inner is eager_transforms._autograd_grad.__code__


def test_disable_when_called_keeps_dynamo_out() -> None:
    """The public fallback of disable_dynamo: the function runs eagerly inside a compiled one."""
    seen: list[bool] = []

    def eager(x: torch.Tensor) -> torch.Tensor:
        seen.append(torch.compiler.is_compiling())
        return x + 1

    disabled = compat._disable_when_called(eager)
    compiled = torch.compile(lambda x: disabled(x) * 2, backend="eager", fullgraph=False)
    torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 4.0))
    assert seen == [False]


_WITHOUT_INTERNALS = """
import torch, torch._functorch.eager_transforms as eager_transforms
for owner, name in [(torch, "_disable_dynamo"), (torch._C, "_TorchDispatchModeKey"),
                    (torch._C._functorch, "TransformType"), (eager_transforms, "_autograd_grad")]:
    delattr(owner, name)
import autograd_groups as ag
from autograd_groups import compat
assert compat.disable_dynamo is compat._disable_when_called and not compat.is_compiling()
for missing in (lambda: compat.TransformType.Grad, compat.grad_transform_codes):
    try:
        missing()
    except ag.UnsupportedRelease as e:
        print(e)
x = torch.tensor([[0.0, 1.0], [0.0, 1.0]], requires_grad=True)
ag.ops.cdist(x, x).sum().backward()
print(torch.isfinite(x.grad).all().item())
"""


def test_a_release_without_some_internals_still_imports() -> None:
    """A release that lacks a detected name imports the package, uses the public equivalent where
    there is one, and refuses by name only the feature that needs the name."""
    ran = subprocess.run([sys.executable, "-c", _WITHOUT_INTERNALS], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("a group under torch.func needs torch._C._functorch.TransformType.Grad")
    assert lines[1].startswith("a group with rules under torch.func.grad needs "
                               "torch._functorch.eager_transforms.grad_and_value_impl calling _autograd_grad")
    assert all(f"PyTorch {torch.__version__} does not have" in line for line in lines[:2])
    assert lines[2] == "True"

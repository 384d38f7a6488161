"""The package's public face: its version, the names it shows, and what importing it does."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import autograd_groups as ag


def test_the_package_has_a_version_and_shows_no_helpers_of_its_own() -> None:
    assert ag.__version__ == importlib.metadata.version("autograd-groups")
    assert not {"Any", "importlib", "_version"} & set(dir(ag))


def test_the_built_in_spec_loads_at_the_first_use_of_ops_not_at_import() -> None:
    code = ("import autograd_groups as ag\n"
            "assert 'ops.cdist' not in ag.list_rules()\n"
            "ag.ops.cdist\n"
            "assert 'ops.cdist' in ag.list_rules()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_importing_the_package_imports_nothing_of_torch_or_numpy_that_torch_does_not() -> None:
    """torch.export (and through it NumPy, not a dependency, whose absence torch reports on stderr)
    is imported where it is used, never by ``import autograd_groups`` itself."""
    code = ("import sys, torch; before = set(sys.modules); import autograd_groups; "
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('torch', 'numpy')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]" and done.stderr == "", done.stderr


def test_importing_the_package_leaves_rich_and_yaml_to_their_first_use_and_cdist_needs_no_sympy() -> None:
    """rich draws reports and PyYAML reads specs: importing either takes longer than the rest of the
    package, so neither is imported by ``import autograd_groups``. ``ag.ops`` reads the built-in spec
    (PyYAML); its first cdist, forward and backward, imports nothing more (torch.broadcast_shapes
    would import sympy, most of a second)."""
    code = ("import sys, torch; import autograd_groups as ag\n"
            "print(sorted(m for m in ('rich', 'yaml', 'sympy') if m in sys.modules))\n"
            "ag.ops; before = set(sys.modules)\n"
            "x = torch.randn(4, 3, requires_grad=True); ag.ops.cdist(x, torch.randn(5, 3)).sum().backward()\n"
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - {'torch'}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]"]

"""What a type checker sees of the package in a user's script: ``ag.ops`` and the precise rule types."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

USER_SCRIPT = """\
import torch
import autograd_groups as ag

x = torch.randn(3, 2)
d = ag.ops.cdist(x, x)
rule = ag.register_rule("cdist", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
op: str = rule.op
safe = ag.register_rule("pow_composite", ag.NanSafe())
reveal_type(ag.ops.cdist)
reveal_type(rule)
reveal_type(safe)
"""

# torch and the other dependencies are left unfollowed (Any): checking them would take a minute, and
# only this package's own types are under test.
MYPY_CONFIG = """\
[mypy]
[mypy-torch.*,networkx.*,rich.*,yaml.*]
follow_imports = skip
ignore_missing_imports = True
"""


@pytest.mark.slow
def test_mypy_sees_ag_ops_and_the_type_of_the_registered_rule(tmp_path: Path) -> None:
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir",
         str(tmp_path / "cache"), str(tmp_path / "user.py")],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "MYPYPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    revealed = [line.split("Revealed type is ", 1)[1] for line in done.stdout.splitlines()
                if "Revealed type is" in line]
    assert revealed[0].startswith('"def (x1: '), revealed
    assert revealed[1:] == ['"autograd_groups.rules.kinds.Subgradient"',
                            '"autograd_groups.rules.kinds.NanSafe"']

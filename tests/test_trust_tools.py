"""Issue 28 §3: the observing tools leave a script that uses torch.func as it runs alone. The
command line's ``stats``, ``viz`` and ``verify`` on a script with ``vmap(grad)``, ``hessian`` and
``jacrev(jacrev)`` over a built-in and a user group exit with its code (0) and print what it prints;
``ag.trace()`` and ``ag.stats()`` in-process change none of its results; what cannot be counted under
vmap is said."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import trust_cases as tc
from torch.func import grad, hessian, jacrev, vmap

import autograd_groups as ag

SCRIPT = textwrap.dedent('''
    import torch
    from torch.func import grad, hessian, jacrev, vmap

    import autograd_groups as ag

    ag.register_rule("softplus", ag.NanSafe())


    @ag.autograd_group("softplus")
    def softplus(x):
        return torch.where(x < 20, torch.log1p(torch.exp(x)), x)


    x = torch.tensor([[0.0, 1.0], [0.0, 1.0], [2.0, 0.5]], dtype=torch.float64)
    far = torch.tensor([0.0, 1000.0], dtype=torch.float64)
    print("vmap(grad) cdist", vmap(grad(lambda p: ag.ops.cdist(p[None], x).sum()))(x))
    print("vmap(grad) softplus", vmap(grad(lambda r: softplus(r).sum()))(far[None]))
    print("hessian softplus", hessian(lambda r: softplus(r).sum())(far))
    print("hessian cdist", hessian(lambda p: ag.ops.cdist(p[None], x[2:]).sum() ** 2)(x[0]))
    print("jacrev(jacrev) softplus", jacrev(jacrev(lambda r: softplus(r).sum()))(far))
    print("jacrev(jacrev) cdist", jacrev(jacrev(lambda p: ag.ops.cdist(p[None], x[2:]).sum() ** 2))(x[0]))
''')


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("tools") / "transforms.py"
    path.write_text(SCRIPT)
    # torch's own deprecation notices (torch.jit.script on 2.15) are no library warning.
    alone = subprocess.run([sys.executable, "-W", "ignore::FutureWarning", str(path)], capture_output=True,
                           text=True, timeout=300)
    assert alone.returncode == 0 and alone.stderr == "", alone.stderr
    return path, alone.stdout


@pytest.mark.parametrize("command", ["stats", "viz", "verify"])
def test_the_cli_leaves_a_script_under_torch_func_transforms_as_it_runs_alone(
        script: tuple[Path, str], command: str) -> None:
    path, alone = script
    done = subprocess.run([sys.executable, "-W", "ignore::FutureWarning", "-m", "autograd_groups.cli",
                           command, str(path)],
                          capture_output=True, text=True, timeout=300, env={"COLUMNS": "100", "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(alone), done.stdout
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr, done.stderr
    report = done.stdout[len(alone):]
    if command == "stats":
        assert "unknown: under vmap" in report and "under vmap)" in report
    if command == "verify":
        assert "it ran under vmap, on a batch of inputs" in report


def test_trace_and_stats_in_process_change_no_result_under_transforms() -> None:
    with ag.registry_scope():
        softplus = tc.softplus("tools.softplus")
        points = torch.tensor([[0.0, 1.0], [0.0, 1.0], [2.0, 0.5]], dtype=torch.float64)
        far = torch.tensor([0.0, 1000.0], dtype=torch.float64)
        runs = {
            "vmap(grad) cdist": lambda: vmap(grad(lambda p: ag.ops.cdist(p[None], points).sum()))(points),
            "vmap(grad) softplus": lambda: vmap(grad(lambda r: softplus(r).sum()))(far[None]),
            "hessian": lambda: hessian(lambda r: softplus(r).sum())(far),
            "jacrev(jacrev)": lambda: jacrev(jacrev(
                lambda p: ag.ops.cdist(p[None], points[2:]).sum() ** 2))(points[0]),
        }
        with warnings.catch_warnings():
            warnings.simplefilter("error", ag.RuleWarning)
            alone = {name: run() for name, run in runs.items()}
            ag.reset_stats()
            with ag.trace() as session:
                traced = {name: run() for name, run in runs.items()}
            counts = ag.stats()
    for name in runs:
        assert torch.equal(alone[name], traced[name]), name
    assert {i.name for i in session.instances} == {"ops.cdist", "tools.softplus"}
    rules = counts["tools.softplus"]["sites"]
    assert any(rule["uncounted"] for site in rules.values() for rule in site["rules"].values())

"""`autograd-groups viz` and `stats`, run as the user runs them: a subprocess on a script."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pydot
import pytest
import torch

import autograd_groups as ag
from autograd_groups import cli, viz
from conftest import assert_fits

pytestmark = pytest.mark.filterwarnings("ignore:'setParseAction' deprecated")

NESTED = textwrap.dedent('''
    import sys
    import torch
    import autograd_groups as ag

    ag.register_rule("beta", ag.Subgradient(op="sqrt", when="result == 0", grad=0))


    @ag.autograd_group("beta")
    def beta(x):
        return x.sqrt() * 2


    @ag.autograd_group("alpha")
    def alpha(x):
        return beta(x).exp().sum()


    x = torch.tensor([0.0, 1.0, 4.0], requires_grad=True)
    for _ in range(3):
        alpha(x).backward()
''')

STATS = textwrap.dedent('''
    import sys
    import torch
    import autograd_groups as ag

    ag.register_rule("hit", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    ag.register_rule("miss", ag.Subgradient(op="sqrt", when="result == 0", grad=0))


    @ag.autograd_group("hit")
    def hit(x):
        return x.sqrt().sum()


    @ag.autograd_group("miss")
    def miss(x):
        return x.sqrt().sum()


    @ag.autograd_group("plain")
    def plain(x):
        return (x * 2).sum()


    x = torch.tensor(ZEROS + [1.0, 4.0], requires_grad=True)
    y = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    for _ in range(int(sys.argv[1])):
        (hit(x) + miss(y) + plain(y)).backward()
''')


def script(tmp_path: Path, source: str, name: str = "script.py") -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def run(*args: str, path: str | None = None, cwd: Path | None = None, columns: int = 200,
        pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    """``autograd-groups ARGS`` in a subprocess whose stdout is a pipe, not a terminal."""
    env = dict(os.environ, COLUMNS=str(columns))
    if path is not None:
        env["PATH"] = path
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-m", "autograd_groups.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def empty_folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder


def test_viz_draws_svg_and_png_with_no_dot_on_path(tmp_path: Path) -> None:
    source = script(tmp_path, NESTED)
    no_dot = str(empty_folder(tmp_path, "bin"))
    done = run("viz", str(source), "--out", str(tmp_path / "g.svg"), path=no_dot)
    assert done.returncode == 0, done.stderr
    svg = (tmp_path / "g.svg").read_text()
    ET.fromstring(svg.encode())
    assert "alpha ×3" in svg and "beta" in svg
    done = run("viz", str(source), "--out", str(tmp_path / "g.png"), path=no_dot)
    assert done.returncode == 0, done.stderr
    png = (tmp_path / "g.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000


def test_viz_without_graphviz_says_how_to_install_it_and_writes_dot(tmp_path: Path) -> None:
    source = script(tmp_path, NESTED)
    # Neither a dot program on PATH nor an importable pygraphviz (a package that refuses to import).
    hidden = empty_folder(tmp_path, "hide")
    (hidden / "pygraphviz").mkdir()
    (hidden / "pygraphviz" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    done = run("viz", str(source), "--out", str(tmp_path / "g.svg"), path=str(empty_folder(tmp_path, "bin")),
               pythonpath=str(hidden))
    assert done.returncode == 1
    for hint in ("pip install 'autograd-groups[viz]'", "apt-get install graphviz", "brew install graphviz",
                 "conda install graphviz"):
        assert hint in done.stderr
    assert not (tmp_path / "g.svg").exists()
    (graph,) = pydot.graph_from_dot_file(str(tmp_path / "g.dot"))
    assert [s.get_name() for s in graph.get_subgraphs()] == ["cluster_c0"]


def test_a_script_that_raises_is_drawn_up_to_there_and_exits_1_with_its_traceback(tmp_path: Path) -> None:
    source = script(tmp_path, NESTED + "\nraise ValueError('planted failure')\n", name="failing.py")
    done = run("viz", str(source), "--out", str(tmp_path / "g.dot"))
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert f'File "{source}", line' in done.stderr and "ValueError: planted failure" in done.stderr
    assert "runpy" not in done.stderr
    assert (f"autograd-groups viz: {source} failed: it raised ValueError (traceback above), exit code 1; "
            f"what it recorded up to then is drawn above") in done.stderr
    (graph,) = pydot.graph_from_dot_file(str(tmp_path / "g.dot"))  # the three passes before the raise
    assert "alpha ×3" in graph.to_string()


@pytest.mark.parametrize("command", ["viz", "stats"])
def test_a_script_that_exits_with_a_code_is_reported_up_to_there_and_passes_the_code_on(
        tmp_path: Path, command: str) -> None:
    source = script(tmp_path, NESTED + "\nsys.exit(4)\n")
    done = run(command, str(source), cwd=tmp_path)
    assert done.returncode == 4
    assert f"{source} failed: it called sys.exit(4), exit code 4" in done.stderr
    shown = "alpha ×3" if command == "viz" else "beta"
    assert shown in done.stdout


def test_missing_script_exits_2(tmp_path: Path) -> None:
    for command in ("viz", "stats"):
        done = run(command, str(tmp_path / "nope.py"))
        assert done.returncode == 2
        assert f"no such script: {tmp_path / 'nope.py'}" in done.stderr


def test_arguments_after_dashes_reach_the_script(tmp_path: Path) -> None:
    record = tmp_path / "argv.json"
    source = script(tmp_path, NESTED + textwrap.dedent('''
        import json
        with open(sys.argv[1], "w") as f:
            json.dump({"argv": sys.argv, "name": __name__}, f)
    '''))
    done = run("viz", str(source), "--out", str(tmp_path / "g.mmd"), "--", str(record), "--out", "-v")
    assert done.returncode == 0, done.stderr
    assert json.loads(record.read_text()) == {"argv": [str(source), str(record), "--out", "-v"],
                                              "name": "__main__"}
    assert (tmp_path / "g.mmd").read_text().startswith("flowchart TB")


def test_viz_without_out_prints_a_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["viz", str(script(tmp_path, NESTED))]) == 0
    out = capsys.readouterr().out
    # sqrt meets 0 once per pass (x[0]), three passes.
    assert "alpha ×3" in out and "subgradient(sqrt: result == 0 -> 0): 3 elements changed" in out


def table_rows(text: str) -> list[list[str]]:
    """The data rows of the rich tables in ``text``, each a list of its stripped cells."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


LABEL = "subgradient(sqrt: result == 0 -> 0)"


@pytest.mark.parametrize("columns", [200, 80])
def test_stats_counts_and_lists_groups_that_never_hit_a_special_point(tmp_path: Path, columns: int) -> None:
    steps, zeros = 3, [0.0, 0.0]
    source = script(tmp_path, STATS.replace("ZEROS", repr(zeros)))
    done = run("stats", str(source), "--", str(steps), columns=columns, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_fits(done.stdout, columns, whole=["hit", "miss", "plain", LABEL])
    # The groups' table (group and the line that created its instances, instances, off, backward
    # passes, verdict), then the rules' table (group / rule, calls, changed): the group's name and
    # line, then one row per rule.
    at = f"at script.py:{STATS.splitlines().index('    (hit(x) + miss(y) + plain(y)).backward()') + 1}"
    assert table_rows(done.stdout) == [
        ["hit", str(steps), "0", str(steps), "keep on"], [at, "", "", "", ""],
        ["miss", str(steps), "0", str(steps), "can be off"], [at, "", "", "", ""],
        ["plain", str(steps), "0", "-", "no rules registered"], [at, "", "", "", ""],
        ["hit", "", ""], [at, "", ""], [LABEL, str(steps), str(steps * len(zeros))],
        ["miss", "", ""], [at, "", ""], [LABEL, str(steps), "0"],
    ]
    line = 'with ag.special_cases(False, groups=["miss"]):'
    assert line in done.stdout.splitlines()
    compile(line + "\n    pass\n", "<pasted>", "exec")


def test_stats_keeps_a_long_group_name_whole_at_80_columns(tmp_path: Path) -> None:
    name = "pairwise_distance_between_rows_of_x"
    source = script(tmp_path, STATS.replace("ZEROS", "[0.0]").replace('"miss"', repr(name)))
    done = run("stats", str(source), "--", "1", columns=80)
    assert done.returncode == 0, done.stderr
    assert_fits(done.stdout, 80, whole=[name, LABEL, "can be off"])


def test_stats_json_is_the_report_of_ag_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps, zeros = 2, [0.0, 0.0, 0.0]
    source = script(tmp_path, STATS.replace("ZEROS", repr(zeros)) + "\nprint('the script talks')\n")
    assert cli.main(["stats", str(source), "--json", "--", str(steps)]) == 0
    captured = capsys.readouterr()
    assert "the script talks" in captured.err        # stdout holds the JSON alone
    report = json.loads(captured.out)
    counted = ag.stats()                             # what the run left in the process's counters
    assert [g["name"] for g in report["groups"]] == sorted(counted) == ["hit", "miss", "plain"]
    for group in report["groups"]:
        count = counted[group["name"]]
        assert {k: group[k] for k in ("instances", "instances_off", "backward_passes", "compiled")} == \
            {k: count[k] for k in ("instances", "instances_off", "backward_passes", "compiled")}
        assert [(r["label"], r["kind"], r["calls"], r["changed"]) for r in group["rules"]] == \
            [(label, r["kind"], r["calls"], r["elements"]) for label, r in count["rules"].items()]
    verdicts = {g["name"]: g["verdict"] for g in report["groups"]}
    assert verdicts == {"hit": "keep on", "miss": "can be off", "plain": "no rules registered"}
    assert report["groups"][0]["rules"][0]["changed"] == steps * len(zeros)
    assert report["can_be_off"] == ["miss"]


def test_version_is_the_installed_package_version() -> None:
    from importlib.metadata import version

    done = run("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"autograd-groups {version('autograd-groups')}"
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'version = "{version("autograd-groups")}"' in pyproject


def test_stats_script_that_fails_passes_its_exit_code_on(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["stats", str(script(tmp_path, "import sys\nsys.exit(3)\n"))]) == 3
    assert cli.main(["stats", str(script(tmp_path, "raise KeyError('k')\n"))]) == 1
    captured = capsys.readouterr()
    assert "KeyError: 'k'" in captured.err and "│" not in captured.out


def test_json_out_and_group_filter_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = str(script(tmp_path, NESTED))
    with ag.registry_scope():
        assert cli.main(["viz", source, "--group", "beta", "--out", str(tmp_path / "t.json")]) == 0
    loaded = ag.Trace.load(tmp_path / "t.json")
    assert [i.name for i in loaded.instances] == ["beta"] * 3
    with ag.registry_scope():
        assert cli.main(["viz", source, "--group", "gamma"]) == 1
    assert "no instance of group 'gamma' was traced; traced groups: alpha, beta" in capsys.readouterr().err
    assert cli.main(["viz", source, "--out", str(tmp_path / "t.txt")]) == 2
    assert not (tmp_path / "t.txt").exists()


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_honour_the_umask(tmp_path: Path, umask: int,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    source = str(script(tmp_path, NESTED))
    with ag.trace() as session:
        ag.autograd_group("double")(lambda x: x * 2)(torch.ones(2, requires_grad=True)).sum().backward()
    previous = os.umask(umask)
    try:
        with ag.registry_scope():
            assert cli.main(["viz", source, "--out", str(tmp_path / "cli.dot")]) == 0
        session.save(tmp_path / "trace.json")
        viz.write(session.instances, tmp_path / "drawn.mmd")
    finally:
        os.umask(previous)
    for name in ("cli.dot", "trace.json", "drawn.mmd"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


SITES = textwrap.dedent('''
    import torch
    import autograd_groups as ag

    # A rule that never applies (sqrt's result is never negative): the NaN stays.
    ag.register_rule("wrong", ag.Subgradient(op="sqrt", when="result < 0", grad=0))
    ag.register_rule("shared", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    wrong = ag.autograd_group("wrong")(lambda v: (v * v).sum(-1).sqrt())
    shared = ag.autograd_group("shared")(lambda v: (v * v).sum(-1).sqrt())

    zero, far = torch.zeros(2, 3, requires_grad=True), torch.ones(2, 3, requires_grad=True)
    for _ in range(2):
        wrong(zero).sum().backward()
        shared(zero).sum().backward()  # always at the special point
        shared(far).sum().backward()   # never
''')


def test_stats_gives_nan_gradients_their_verdict_and_call_sites_their_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = script(tmp_path, SITES)
    with ag.registry_scope():
        assert cli.main(["stats", str(source), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    line = {text.strip(): k + 1 for k, text in enumerate(SITES.splitlines())}
    rows = {(g["name"], g["where"].rpartition(":")[2]): g for g in report["groups"]}
    wrong = rows["wrong", str(line["wrong(zero).sum().backward()"])]
    assert wrong["verdict"] == "non-finite gradients" and wrong["nonfinite_gradients"] == 2
    at_zero = rows["shared", str(line["shared(zero).sum().backward()  # always at the special point"])]
    apart = rows["shared", str(line["shared(far).sum().backward()   # never"])]
    assert (at_zero["verdict"], apart["verdict"]) == ("keep on", "can be off")
    assert report["can_be_off"] == []  # neither group is safe everywhere
    with ag.registry_scope():
        assert cli.main(["stats", str(source)]) == 0
    out = capsys.readouterr().out
    assert "with ag.special_cases(False, groups=" not in out.split("shared never reached")[0]
    assert "shared never reached a special point at" in out and 'groups=["shared"]):' in out
    assert "non-finite gradients: its input gradients came out NaN or infinite with its rules on" in \
        " ".join(out.split())


def test_viz_of_a_spec_file_says_it_runs_a_python_script(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "groups.yaml"
    spec.write_text("- name: g(Tensor x) -> Tensor\n  special_cases:\n    - nan_safe: true\n")
    for command in ("viz", "stats"):
        assert cli.main([command, str(spec)]) == 2
        assert (f"autograd-groups {command}: error: {spec} is a spec file; `{command}` runs a Python script"
                in capsys.readouterr().err)


def test_script_arguments_without_dashes_are_told_to_go_after_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = str(script(tmp_path, NESTED))
    assert cli.main(["viz", source, "--epochs", "3", "--out", "g.svg"]) == 2
    err = capsys.readouterr().err
    assert ("autograd-groups viz: error: unrecognized arguments: --epochs; arguments for the script go after "
            f"`--`: autograd-groups viz {source} -- --epochs 3") in err
    with pytest.raises(SystemExit) as caught:  # a command without a script: argparse's own error
        cli.main(["check", "--epochs", "x.yaml"])
    assert caught.value.code == 2


def test_a_near_miss_of_a_traced_group_says_did_you_mean(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    source = str(script(tmp_path, NESTED))
    with ag.registry_scope():
        assert cli.main(["viz", source, "--group", "alhpa"]) == 1
    assert ("no instance of group 'alhpa' was traced; traced groups: alpha, beta; did you mean 'alpha'?"
            in capsys.readouterr().err)


def test_stats_draws_keep_on_in_a_neutral_colour_and_only_non_finite_gradients_in_red() -> None:
    from rich.console import Console

    from autograd_groups.viz import stats

    rule = stats.RuleRow("subgradient(sqrt: result == 0 -> 0)", "subgradient", calls=1, changed=1)
    found = [stats.GroupReport("kept", 1, 0, 1, rules=[rule]),
             stats.GroupReport("broken", 1, 0, 1, rules=[rule], nonfinite=1)]
    assert [r.verdict for r in found] == [stats.KEEP, stats.NONFINITE]
    console = Console(record=True, width=100, color_system="standard", force_terminal=True)
    console.print(stats.group_table(found))
    styled = re.findall(r"\x1b\[([\d;]+)m(keep on|non-finite gradients)", console.export_text(styles=True))
    drawn = {verdict: codes.split(";") for codes, verdict in styled}
    red = "31"  # the ANSI foreground code of the error colour
    assert red not in drawn["keep on"] and red in drawn["non-finite gradients"], drawn


REGION = """
import torch
import autograd_groups as ag

@ag.autograd_group("length", compile=True)
def length(v):
    return v.pow(2).sum(-1).sqrt()

ag.register_rule("length", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
for _ in range(2):
    v = torch.zeros(2, 3, requires_grad=True)
    length(v).sum().backward()
"""


def test_stats_says_how_the_calls_of_a_compiled_group_ran(tmp_path: Path) -> None:
    """Under ``stats`` a ``compile=True`` group runs eagerly, so that every rule hit is counted."""
    done = run("stats", str(script(tmp_path, REGION)))
    assert done.returncode == 0, done.stderr
    assert ("length (compile=True): 0 calls compiled, 2 eagerly (observed by trace or detect_nonfinite: 2); "
            "0 compiled graphs") in done.stdout
    assert "keep on" in done.stdout  # its rule's hits, counted

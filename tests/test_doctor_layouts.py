"""``autograd-groups doctor`` on training scripts laid out the ways real ones are: a forward that runs
before an earlier backward of its step (a GAN, two losses), a step that trains in a thread of its
own, data that the step itself makes non-finite, a class the script pickles, a script that cannot
run twice, a reentrant checkpoint, and groups whose tangents take backward passes of their own."""

from __future__ import annotations

import textwrap
import weakref
from pathlib import Path

import pytest
import torch

import autograd_groups as ag
from autograd_groups.doctor.diagnose import diagnose
from autograd_groups.doctor.instruments import ForwardWatch
from autograd_groups.doctor.session import Session
from autograd_groups.script import run_script
from tests.conftest import line_of


def _script(tmp_path: Path, name: str, text: str) -> Path:
    script = tmp_path / name
    script.write_text(textwrap.dedent(text))
    return script


GAN = """\
    import torch
    torch.manual_seed(0)
    class G(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 6)
        def forward(self, z):
            v = torch.tanh(self.fc(z))
            n = v.pow(2).sum(-1, keepdim=True).sqrt()  # born
            return torch.cat([v, n], -1)
    g, d = G(), torch.nn.Sequential(torch.nn.Linear(7, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1))
    with torch.no_grad():
        g.fc.weight.zero_(); g.fc.bias.zero_()
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-4)
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-4)
    bce = torch.nn.BCEWithLogitsLoss()
    real = torch.randn(8, 7)
    for step in range(2):
        fake = g(torch.randn(8, 4))
        d_loss = bce(d(real), torch.ones(8, 1)) + bce(d(fake.detach()), torch.zeros(8, 1))
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(d(fake), torch.ones(8, 1))
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
"""


def test_a_generator_run_before_the_discriminators_step_is_found_at_its_own_line(tmp_path: Path) -> None:
    """The DCGAN tutorial's layout: the fake batch is made once, before the discriminator's backward
    and step, and the generator's loss goes bad after them. The forward is watched from there."""
    script = _script(tmp_path, "gan.py", GAN)
    report, _ = diagnose(str(script))
    assert (report.cls, report.born.node, report.born.line, report.born.function) == \
        ("B", "SqrtBackward0", line_of(script, "# born"), "forward")
    # The rule on G.forward, whose input needs no gradient, is verified at G's parameters.
    assert [p.kind for p in report.proposals if p.checked] == ["native", "builtin", "rule"]
    assert report.notes == []  # a replay that reached the step, no reentrant checkpoint: nothing to say


def test_losses_computed_before_the_first_of_their_backward_passes_keep_their_lines(tmp_path: Path) -> None:
    script = _script(tmp_path, "two.py", """\
        import torch
        w = torch.nn.Parameter(torch.tensor([0.5, -200.0]))
        for step in range(2):
            la = w.pow(2).sum()
            p = torch.sigmoid(w * (step + 1))
            lb = -torch.log(p).sum()  # born
            la.backward(retain_graph=True)
            lb.backward()
        """)
    report, _ = diagnose(str(script))
    assert (report.cls, report.born.phase, report.born.op, report.born.line) == \
        ("C", "forward", "log", line_of(script, "# born"))


def test_a_step_that_trains_in_a_thread_is_diagnosed(tmp_path: Path, capfd) -> None:
    script = _script(tmp_path, "threaded.py", """\
        import threading
        import torch
        w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
        def train():
            for step in range(2):
                x = w.detach().clone() if step == 1 else torch.zeros(3)
                loss = (x - w).pow(2).sum().sqrt()  # born
                loss.backward()
        t = threading.Thread(target=train)
        t.start()
        t.join()
        """)
    report, code = diagnose(str(script))
    assert code == 0
    born = (report.cls, report.born.node, report.born.line)
    assert born == ("B", "SqrtBackward0", line_of(script, "# born"))
    assert report.proposals[0].checked, report.proposals[0].check
    assert "Exception in thread" not in capfd.readouterr().err


def test_a_nonfinite_value_the_step_makes_of_finite_data_is_born_where_it_is_made(tmp_path: Path) -> None:
    """A batch of one sample standardised by its own std: the data is finite, the step's std of it
    is not. Class C at the std, not E (entered from the data) at the layer that takes it."""
    script = _script(tmp_path, "std.py", """\
        import torch
        torch.manual_seed(0)
        X, Y = torch.randn(9, 5), torch.randn(9, 1)
        model = torch.nn.Linear(5, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for xb, yb in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=4):
            xb = (xb - xb.mean(0)) / xb.std(0)  # born
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        """)
    report, _ = diagnose(str(script))
    assert (report.step, report.cls, report.born.phase, report.born.op, report.born.line) == \
        (3, "C", "forward", "std", line_of(script, "# born"))


@pytest.mark.parametrize("made", [
    "    with torch.no_grad():\n        xb = (xb - xb.mean(0)) / xb.std(0)  # born",
    "    xb = (xb - xb.mean(0)) / xb.std(0)  # born\n    xb.requires_grad_(True)",
    "    xb = xb.clone()\n    xb[:, 2:].sub_(xb.mean(0)[2:]).div_(xb.std(0)[2:])  # born",
])
def test_data_made_non_finite_under_no_grad_or_made_a_leaf_is_born_where_it_is_made(
        made: str, tmp_path: Path) -> None:
    """Preprocessing under torch.no_grad(), and a batch made a leaf (an adversarial example's
    input): still data the step computed, not a parameter or a batch that came in so."""
    script = tmp_path / "made.py"
    script.write_text("import torch\n"
                      "torch.manual_seed(0)\n"
                      "X, Y = torch.randn(9, 5), torch.randn(9, 1)\n"
                      "model = torch.nn.Linear(5, 1)\n"
                      "for i in range(0, 9, 4):\n"
                      "    xb, yb = X[i:i + 4], Y[i:i + 4]\n"
                      f"{made}\n"
                      "    model.zero_grad()\n"
                      "    torch.nn.functional.mse_loss(model(xb), yb).backward()\n")
    report, _ = diagnose(str(script))
    assert (report.step, report.cls, report.born.op, report.born.line) == \
        (3, "C", "std", line_of(script, "# born"))


def test_a_value_detached_from_what_the_step_made_carries_its_birth(tmp_path: Path) -> None:
    """A critic's step on the generator's detached output (WGAN): the NaN the generator's division
    made is born there, in the generator, not data entering the critic."""
    script = _script(tmp_path, "critic.py", """\
        import torch
        torch.manual_seed(0)
        g, c = torch.nn.Linear(3, 5, bias=False), torch.nn.Linear(5, 1)
        for step in range(2):
            z = torch.randn(4, 3)
            if step == 1:
                z[1] = 0.0
            h = g(z)
            fake = h / h.pow(2).sum(1, keepdim=True)  # born
            c.zero_grad()
            c(fake.detach()).mean().backward()
        """)
    report, _ = diagnose(str(script))
    assert (report.step, report.cls, report.born.op, report.born.line) == \
        (2, "C", "div", line_of(script, "# born"))


def test_the_data_of_a_pass_under_no_grad_is_not_kept_alive() -> None:
    """A validation pass in the watched run: its data calls are noted, their tensors not kept."""
    watch = ForwardWatch()
    with watch, torch.no_grad():
        out = torch.nn.functional.relu(torch.randn(64, 64) @ torch.randn(64, 64))
    kept = weakref.ref(out)
    assert watch.data.origin(out) is None
    del out
    assert kept() is None and not watch.data.written


def test_a_sparse_gradient_in_the_bad_step_is_read(tmp_path: Path) -> None:
    """An embedding with sparse=True: its weight's gradient is a sparse tensor, which isfinite
    does not take."""
    script = _script(tmp_path, "sparse.py", """\
        import torch
        emb, head = torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 1)
        for step in range(2):
            ids = torch.tensor([[1, 2], [3, 4]])
            valid = torch.ones(2, 2) if step == 0 else torch.tensor([[1.0, 1.0], [0.0, 0.0]])
            pooled = (emb(ids) * valid[..., None]).sum(1) / valid.sum(1, keepdim=True)  # born
            emb.zero_grad(); head.zero_grad()
            head(pooled).sum().backward()
        """)
    report, _ = diagnose(str(script))
    assert (report.step, report.cls, report.born.op, report.born.line) == \
        (2, "C", "div", line_of(script, "# born"))


def test_compiled_code_in_an_in_process_block_is_diagnosed_as_the_command_replays_it() -> None:
    """Dynamo would trace the instruments and split the graph; the block runs compiled code
    eagerly, as the command's replay does, and names the op and the user's function."""
    def energy(v: torch.Tensor) -> torch.Tensor:
        return v.log().sum()

    compiled = torch.compile(energy, backend="eager")
    w = torch.zeros(3, requires_grad=True)
    with ag.doctor() as report:
        compiled(w).backward()
    assert (report.born.node, report.born.function) == ("LogBackward0", "energy")


@pytest.mark.parametrize("put", [
    "x = torch.tensor([[1.0, 2.0], [float('-inf'), 3.0]]) * 2",  # made so outside torch's calls
    "x = torch.ones(2, 2) * 3; x[1, 0] = float('nan')",  # assigned
    "x = torch.ones(2, 2) * 3; x.data[1, 0] = float('nan')",  # assigned through an alias
    "x = (torch.ones(2, 2) * 3).fill_(float('inf'))",  # filled
])
def test_a_nonfinite_value_put_into_the_data_still_enters_it(put: str, tmp_path: Path) -> None:
    script = _script(tmp_path, "put.py", f"""\
        import torch
        {put}
        model = torch.nn.Linear(2, 1)
        loss = model(x).sum()  # taken
        loss.backward()
        """)
    report, _ = diagnose(str(script))
    assert (report.cls, report.born.op, report.born.line) == ("E", "linear", line_of(script, "# taken"))


def test_a_changed_script_runs_as_main_so_what_it_pickles_is_found(tmp_path: Path) -> None:
    script = tmp_path / "pickles.py"
    script.write_text("")
    source = ("import pickle\n"
              "class Pairs:\n"
              "    pass\n"
              "assert type(pickle.loads(pickle.dumps(Pairs()))).__name__ == 'Pairs'\n")
    assert run_script(str(script), [], source) == 0


def test_a_replay_the_script_cannot_run_says_why(tmp_path: Path) -> None:
    """A script that makes its run folder (exist_ok=False) fails when run again: the report says
    so, rather than leave class G to nondeterminism alone."""
    script = _script(tmp_path, "once.py", f"""\
        import os
        import torch
        os.makedirs({str(tmp_path / "run")!r})
        w = torch.nn.Parameter(torch.zeros(3))
        w.sqrt().sum().backward()
        """)
    report, _ = diagnose(str(script))
    assert report.cls == "G"
    assert any(n.startswith("the replay did not reach backward pass 1: it ended with FileExistsError")
               for n in report.notes), report.notes


def test_a_birth_inside_a_reentrant_checkpoint_says_what_hides_it(tmp_path: Path) -> None:
    text = """\
        import torch
        from torch.utils.checkpoint import checkpoint
        w = torch.nn.Parameter(torch.zeros(3))
        def block(v):
            return v.pow(2).sum().sqrt()  # born
        checkpoint(block, w, use_reentrant={}).backward()
        """
    hidden, _ = diagnose(str(_script(tmp_path, "reentrant.py", text.format(True))))
    seen, _ = diagnose(str(_script(tmp_path, "plain.py", text.format(False))))
    assert hidden.born.node == "CheckpointFunctionBackward"
    assert any("reentrant checkpoint" in n for n in hidden.notes)
    assert (seen.born.node, seen.born.line) == ("SqrtBackward0", 5)
    assert not any("reentrant checkpoint" in n for n in seen.notes)


def test_a_groups_own_backward_passes_are_not_the_scripts() -> None:
    """Under hessian (forward over reverse) a built-in's tangents come from a backward of its own:
    the watch counts the script's backward passes, so that a fixed script's pass N is the
    original's."""
    w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)

    def energy(x: torch.Tensor, v: torch.Tensor, norm) -> torch.Tensor:
        return norm(x - v)

    counts = []
    for norm in (lambda d: d.pow(2).sum().sqrt(), ag.ops.vector_norm):
        session = Session(stops=False)
        with session.installed():
            h = torch.func.hessian(energy)(torch.zeros(3), w, norm)
            h.diagonal().sum().backward()
        counts.append(session.count)
    assert counts[0] == counts[1]

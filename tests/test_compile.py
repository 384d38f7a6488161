"""torch.compile: groups compile with ``fullgraph=True``, their rules inside the compiled backward
graph, and the flag and the registry as they are at each call (docs/compile.md).

Compiles are slow on a small machine: most tests trace with ``aot_eager`` (AOTAutograd's joint
graph, where the rules are recorded, without code generation) and a few with inductor.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_module_simplified

import autograd_groups as ag

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compile")]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def leaf(values, dtype=torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, requires_grad=True)


def grads(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    wanted = [t for t in inputs if t.requires_grad]
    return torch.autograd.grad(fn(*inputs).sum(), wanted)


def compiled_grads(fn, *inputs, backend="aot_eager", dynamic=False) -> tuple[torch.Tensor, ...]:
    """Gradients through ``torch.compile(fn, fullgraph=True)``; fails on any graph break."""
    got = grads(torch.compile(fn, fullgraph=True, backend=backend, dynamic=dynamic), *inputs)
    assert dict(counters["graph_break"]) == {}
    return got


def assert_same(got, want, **tolerance) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **tolerance)


class BackwardGraphs:
    """A backend that keeps the code of every compiled backward graph."""

    def __init__(self) -> None:
        self.backward: list[str] = []

    def __call__(self, gm, example_inputs):
        def keep(graph, _):
            self.backward.append(graph.code)
            return make_boxed_func(graph.forward)

        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: make_boxed_func(g.forward),
                                     bw_compiler=keep)


# Coincident rows: the zero distances where sqrt' is infinite.
ROWS = [[0.0, 0.0], [3.0, 4.0], [3.0, 4.0]]


def coincident(n: int, dtype=torch.float64) -> torch.Tensor:
    """``n`` rows, every pair of rows 2k, 2k+1 equal: more than 25 rows picks cdist's matmul form."""
    torch.manual_seed(n)
    base = torch.randn(n // 2, 3, dtype=dtype)
    return base.repeat_interleave(2, 0).requires_grad_()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [3, 40], ids=["direct", "matmul"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_cdist_compiles_fullgraph_with_inductor(dtype, rows, dynamic):
    x = leaf(ROWS, dtype) if rows == 3 else coincident(rows, dtype)

    def model(a):
        return ag.ops.cdist(a, a.detach())

    got = compiled_grads(model, x, backend="inductor", dynamic=dynamic)
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}
    assert_same(got, grads(model, x), **tolerance)
    assert_same(got, grads(lambda a: torch.cdist(a, a.detach()), x), **tolerance)
    assert torch.isfinite(got[0]).all()


def test_the_rule_is_inside_the_compiled_backward_graph():
    backend = BackwardGraphs()

    def model(a):
        return ag.ops.cdist(a, a.detach())

    x = leaf(ROWS)
    assert_same(compiled_grads(model, x, backend=backend), grads(model, x))
    with ag.special_cases(False):
        assert compiled_grads(model, leaf(ROWS), backend=backend)[0].isnan().any()
    with_rule, plain = backend.backward
    # The sqrt rule (result == 0 -> 0): a compare of the saved result with 0 and a select.
    assert "torch.ops.aten.eq.Scalar" in with_rule and "torch.ops.aten.where.self" in with_rule
    assert "torch.ops.aten.where.self" not in plain


BUILTINS = {
    "vector_norm": (lambda a: ag.ops.vector_norm(a, dim=-1), lambda a: torch.linalg.vector_norm(a, dim=-1),
                    lambda: leaf([[0.0, 0.0], [3.0, 4.0]])),
    "vector_norm p=3": (lambda a: ag.ops.vector_norm(a, 3, dim=-1),
                        lambda a: torch.linalg.vector_norm(a, 3, dim=-1),
                        lambda: leaf([[0.0, 0.0], [1.0, 2.0]])),
    "std": (lambda a: ag.ops.std(a, dim=-1), lambda a: torch.std(a, dim=-1),
            lambda: leaf([[0.5, 0.5, 0.5], [1.0, 2.0, 4.0]])),
    "normalize": (lambda a: ag.ops.normalize(a, dim=-1), lambda a: torch.nn.functional.normalize(a, dim=-1),
                  lambda: leaf([[0.0, 0.0], [3.0, 4.0]])),
    "cdist p=1": (lambda a: ag.ops.cdist(a, a.detach(), p=1), lambda a: torch.cdist(a, a.detach(), p=1),
                  lambda: leaf(ROWS)),
    "atan2": (lambda a: ag.ops.atan2(a, a.detach() * 0), lambda a: torch.atan2(a, a.detach() * 0),
              lambda: leaf([0.0, 1.0, -2.0])),
    # No rules: compiled code runs the plain ops, which Dynamo must trace too.
    "var": (lambda a: ag.ops.var(a, dim=-1), lambda a: torch.var(a, dim=-1),
            lambda: leaf([[0.5, 0.5, 0.5], [1.0, 2.0, 4.0]])),
    "logsumexp": (lambda a: ag.ops.logsumexp(a, -1), lambda a: torch.logsumexp(a, -1),
                  lambda: leaf([[0.0, 1.0, 2.0], [3.0, -1.0, 0.5]])),
}


@pytest.mark.parametrize("name", list(BUILTINS))
def test_builtins_compile_fullgraph(name):
    ours, native, make = BUILTINS[name]
    x = make()
    got = compiled_grads(ours, x)
    assert_same(got, grads(ours, x))
    assert_same(got, grads(native, x))


def test_override_group_compiles_fullgraph():
    """``ops.pow``: an override whose check (a zero base) answers with a bool tensor, at exponents
    2, 0.5 and 1: both branches of the override in one graph."""
    for exponent in (2.0, 0.5, 1.0):
        x = leaf([0.0, 1.0, 2.5])
        got = compiled_grads(lambda a, e=exponent: ag.ops.pow(a, e), x)
        assert_same(got, grads(lambda a, e=exponent: torch.pow(a, e), x))


def test_override_with_an_untraceable_check_is_one_graph_break():
    """A check that is not declared ``-> torch.Tensor`` may call bool(): the group runs eagerly."""

    @ag.autograd_group("cmp_safe_norm")
    def safe_norm(v):
        return v.pow(2).sum(-1).sqrt()

    def fires(ctx):
        return bool((ctx.outputs[0] == 0).any())

    def zero(ctx, grad):
        return torch.zeros_like(ctx.inputs[0])

    def model(v):
        return safe_norm(v * 2) * 3

    with ag.registry_scope():
        ag.register_rule("cmp_safe_norm", ag.Override(fires, zero))
        for rows, want in (([[0.0, 0.0], [3.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]]),
                           ([[1.0, 0.0], [3.0, 4.0]], [[6.0, 0.0], [3.6, 4.8]])):
            x = leaf(rows)
            (got,) = grads(torch.compile(model, backend="aot_eager"), x)
            torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 1
        assert ("group 'cmp_safe_norm' has an override whose check is not declared to return a tensor"
                in str(explained.break_reasons[0].reason))


@ag.autograd_group("cmp_inner")
def inner_norm(v):
    return v.pow(2).sum(-1).sqrt()


@ag.autograd_group("cmp_outer")
def outer(v):
    return inner_norm(v) * 2 + torch.where(v.sum(-1) > 0, v.sum(-1).log(), 0.0)


def with_block(v):
    with ag.autograd_group("cmp_inner"):
        norm = v.pow(2).sum(-1).sqrt()
    return norm * 3


def tagged(v):
    return ag.tag(ag.tag(v.pow(2).sum(-1), "cmp_inner").sqrt(), "cmp_inner") * 3


def reference(v):
    """The double-where form of outer's value: what the rules make of its gradient."""
    squares = v.pow(2).sum(-1)
    safe = torch.where(squares > 0, squares, 1.0)
    sums = v.sum(-1)
    logs = torch.where(sums > 0, torch.where(sums > 0, sums, 1.0).log(), 0.0)
    return torch.where(squares > 0, safe.sqrt(), 0.0) * 2 + logs


@pytest.fixture
def nested_rules():
    with ag.registry_scope():
        ag.register_rule("cmp_inner", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
        ag.register_rule("cmp_outer", ag.NanSafe())
        yield


@pytest.mark.usefixtures("nested_rules")
def test_nested_groups_compile_fullgraph():
    x = leaf([[0.0, 0.0], [-1.0, 0.5], [3.0, 4.0]])
    got = compiled_grads(outer, x)
    assert_same(got, grads(outer, x))
    assert_same(got, grads(reference, x))
    assert torch.isfinite(got[0]).all()


@pytest.mark.usefixtures("nested_rules")
@pytest.mark.parametrize("form", [with_block, tagged], ids=["with", "tag"])
def test_with_blocks_and_tags_compile_fullgraph(form):
    x = leaf([[0.0, 0.0], [3.0, 4.0]])
    got = compiled_grads(form, x)
    torch.testing.assert_close(got[0], torch.tensor([[0.0, 0.0], [1.8, 2.4]], dtype=torch.float64))
    assert_same(got, grads(form, x))


def test_a_with_block_holding_a_decorated_group_nests_in_compiled_code(nested_rules):
    def model(v):
        with ag.autograd_group("cmp_outer"):
            return outer(v) + torch.where(v > 0, v.log(), 0.0).sum(-1)

    x = leaf([[0.0, 0.0], [-1.0, 0.5]])
    got = compiled_grads(model, x)
    assert_same(got, grads(model, x))
    assert torch.isfinite(got[0]).all()


class Recompiles:
    """A backend that counts compilations."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: make_boxed_func(g.forward))


def test_the_flag_is_obeyed_at_every_call_with_one_compile_per_setting():
    backend = Recompiles()
    model = torch.compile(lambda a: ag.ops.cdist(a, a.detach()), fullgraph=True, backend=backend)
    nan = []
    for enabled in (True, False, True, False, True):
        with ag.special_cases(enabled):
            nan.append(bool(grads(model, leaf(ROWS))[0].isnan().any()))
    assert nan == [False, True, False, True, False]
    assert backend.count == 2
    with ag.special_cases(False, groups=["ops.cdist"]):
        assert grads(model, leaf(ROWS))[0].isnan().any()
    with ag.special_cases(False, groups=["other"]):
        assert not grads(model, leaf(ROWS))[0].isnan().any()
    assert backend.count == 4


def test_a_fresh_thread_obeys_the_flag_in_a_function_compiled_there():
    """A thread that never set the flag compiles with its default state: turning special cases off
    afterwards must recompile, not replay the graph compiled with them on."""
    @ag.autograd_group("cmp_thread")
    def grouped(v):
        return v.pow(2).sum(-1, keepdim=True).sqrt() * v

    model = torch.compile(grouped, fullgraph=True, backend="aot_eager")
    x = leaf(ROWS)
    seen = []

    def run():
        seen.append(grads(model, x)[0])
        with ag.special_cases(False):
            seen.append(grads(model, x)[0])

    with ag.registry_scope():
        ag.register_rule("cmp_thread", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    assert torch.isfinite(seen[0]).all()
    plain = grads(grouped.__wrapped__, x)[0]
    # Off: the plain composite's gradient, as the running release gives it.
    torch.testing.assert_close(seen[1], plain, equal_nan=True)


def test_a_rule_registered_after_compiling_applies_at_the_next_call():
    @ag.autograd_group("cmp_late")
    def norm(v):
        return v.pow(2).sum(-1).sqrt()

    model = torch.compile(norm, fullgraph=True, backend="aot_eager")
    assert grads(model, leaf(ROWS))[0].isnan().any()
    with ag.registry_scope():
        ag.register_rule("cmp_late", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
        assert not grads(model, leaf(ROWS))[0].isnan().any()
    assert grads(model, leaf(ROWS))[0].isnan().any()  # the scope undid the rule


def test_a_backward_scope_cannot_reach_compiled_rules_and_says_so():
    model = torch.compile(lambda a: ag.ops.cdist(a, a.detach()), fullgraph=True, backend="aot_eager")
    x = leaf(ROWS)
    loss = model(x).sum()
    told = r"cannot turn off the rules of 'ops\.cdist' inside torch\.compile'd"
    with pytest.warns(UserWarning, match=told), ag.special_cases(False, during="backward"):
        loss.backward()
    assert torch.isfinite(x.grad).all()  # the rules the forward compiled in, as the warning says


@pytest.mark.parametrize("forward", ["eager", "compiled"])
def test_compiled_autograd_applies_the_rules(forward):
    def model(a):
        return (ag.ops.cdist(a, a.detach()) * torch.arange(3.0, dtype=a.dtype)).sum()

    run = torch.compile(model, backend="aot_eager") if forward == "compiled" else model
    want = grads(model, leaf(ROWS))
    for scale in (1.0, 2.0):  # a second backward reuses the compiled one with new saved values
        x = (leaf(ROWS) * scale).detach().requires_grad_()
        # The forward inside the block too: a rule site keeps its saved values for compiled
        # autograd only while it is enabled (docs/compile.md).
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
            loss = run(x)
            loss.backward()
        assert_same((x.grad,), grads(model, x))
    assert_same((x.grad,), want)
    assert dict(counters["graph_break"]) == {}


def test_a_rule_site_keeps_no_saved_values_until_compiled_autograd_is_on():
    """Importing Dynamo costs a group nothing: a site keeps its saved values only while compiled
    autograd is enabled or configured, and a compiled-autograd backward of a forward that ran
    without it raises, naming the fix, rather than giving the plain (NaN) gradient."""
    from autograd_groups.sites import hooks

    def model(a):
        return (ag.ops.cdist(a, a.detach()) * torch.arange(3.0, dtype=a.dtype)).sum()

    kept = []
    capture = hooks.capture

    def spy(node, rules):
        values = capture(node, rules)
        kept.append(bool(values))
        return values

    hooks.capture = spy
    try:
        x = leaf(ROWS)
        loss = model(x)
        assert kept and not any(kept)
        with torch._dynamo.config.patch(compiled_autograd=True):
            model(leaf(ROWS))
        assert kept[-1]
    finally:
        hooks.capture = capture
    # Torch 2.11's Dynamo, tracing the hook, can fail to trace the raise itself (an internal error
    # about the exception's attributes) once other tests compiled: an error either way, never NaN.
    errors = (ag.RuleError, torch._dynamo.exc.InternalTorchDynamoError)
    with pytest.raises(errors) as raised, \
            torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
        loss.backward()
    if isinstance(raised.value, ag.RuleError):
        assert "compiled autograd was neither enabled nor configured" in str(raised.value)


OVERRIDES = {
    "pow": (lambda a, b: ag.ops.pow(a, b), torch.pow),
    "atan2": (lambda a, b: ag.ops.atan2(a, b), torch.atan2),
}


@pytest.mark.parametrize("name", list(OVERRIDES))
def test_compiled_autograd_runs_an_override_group(name):
    """The override's Function calls torch.autograd.grad in its backward; compiled autograd traces
    it, whether the check fires (a zero base; the origin) or not."""
    ours, native = OVERRIDES[name]
    for first in (0.0, 0.5):
        x = leaf([first, 1.0, -2.0])
        other = torch.tensor([2.0 if first else 0.0, 3.0, -1.0], dtype=torch.float64)
        loss = (ours(x, other) * torch.arange(1.0, 4.0, dtype=x.dtype)).sum()
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
            loss.backward()
        want = grads(lambda a, b=other: native(a, b) * torch.arange(1.0, 4.0, dtype=a.dtype),
                     leaf([first, 1.0, -2.0]))
        assert_same((x.grad,), want)


def test_compiled_autograd_obeys_a_backward_scope():
    """Compiled autograd traces the backward when it runs, so the scope is read (and guarded) then."""

    def model(a):
        return ag.ops.cdist(a, a.detach()).sum()

    nan = []
    for enabled in (True, False, True):
        x = leaf(ROWS)
        with ag.special_cases(enabled, during="backward"), \
                torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
            model(x).backward()
        nan.append(bool(x.grad.isnan().any()))
    assert nan == [False, True, False]


def test_compiled_autograd_by_config():
    model = torch.compile(lambda a: ag.ops.cdist(a, a.detach()).sum(), backend="aot_eager")
    x = leaf(ROWS)
    with torch._dynamo.config.patch(compiled_autograd=True):
        model(x).backward()
    assert_same((x.grad,), grads(lambda a: torch.cdist(a, a.detach()), leaf(ROWS)))


def test_observers_are_told_what_they_cannot_see_and_stats_say_compiled():
    ag.reset_stats()
    model = torch.compile(lambda a: ag.ops.cdist(a, a.detach()), fullgraph=True, backend="aot_eager")
    grads(model, leaf(ROWS))
    assert ag.stats()["ops.cdist"]["compiled"] is True
    assert ag.stats()["ops.cdist"]["instances"] == 0  # compiled calls are not counted as zero hits
    told = r"group 'ops\.cdist' runs inside a torch\.compile'd graph"
    with pytest.warns(UserWarning, match=told), ag.trace() as t:
        grads(model, leaf(ROWS))
    assert t.instances == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per group
        with ag.detect_nonfinite():
            grads(model, leaf(ROWS))
    from autograd_groups.viz.stats import COMPILED, reports

    (report,) = reports(ag.stats(), ag.list_rules())
    assert report.verdict == COMPILED


class Pairwise(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 3, dtype=torch.float64)

    def forward(self, x):
        z = self.lin(x)
        return ag.ops.cdist(z, z).sum()


def test_export_warns_that_its_program_has_no_rules():
    model, x = Pairwise(), torch.randn(6, 3, dtype=torch.float64)
    with pytest.warns(UserWarning, match=r"group 'ops\.cdist' has special-case rules that torch\.export "
                                         r"cannot carry"):
        exported = torch.export.export(model, (x,))
    module = exported.module()
    module(x).backward()  # what the warning said: the plain composite's gradient
    assert any(p.grad.isnan().any() for p in module.parameters())
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"torch\.export \(strict\) cannot carry"):
        torch.export.export(model, (x,), strict=True)
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        with ag.special_cases(False, groups=["ops.cdist"]):
            torch.export.export(model, (x,), strict=True)
    assert not [w for w in told if "ops.cdist" in str(w.message)]


@pytest.mark.parametrize("strict", [False, True])
def test_export_with_a_dynamic_batch_keeps_both_cdist_forms(strict):
    model = Pairwise()
    batch = torch.export.Dim("batch", max=4096)
    with ag.special_cases(False, groups=["ops.cdist"]):
        exported = torch.export.export(model, (torch.randn(30, 3, dtype=torch.float64),),
                                       dynamic_shapes={"x": {0: batch}}, strict=strict)
    for rows in (5, 40):  # either side of torch.cdist's switch to the matmul form at 25 rows
        x = torch.randn(rows, 3, dtype=torch.float64)
        torch.testing.assert_close(exported.module()(x), model(x))


def test_torchscript_is_told_or_refused():
    model, x = Pairwise(), torch.randn(6, 3, dtype=torch.float64)
    with pytest.warns(UserWarning, match=r"group 'ops\.cdist' has special-case rules that torch\.jit\.trace"):
        torch.jit.trace(model, (x,))
    with pytest.raises(ag.GroupError, match=r"group 'ops\.cdist' has special-case rules that TorchScript"):
        torch.jit.script(model)


def test_inference_compiles_fullgraph():
    model, x = Pairwise(), torch.randn(6, 3, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True, backend="aot_eager")(x), model(x))
    assert dict(counters["graph_break"]) == {}


def test_grouping_compiled_code_is_refused():
    """A group around an already compiled function would hide its ops in one compiled node."""
    compiled_norm = torch.compile(lambda t: t.pow(2).sum(-1).sqrt(), backend="aot_eager")
    with ag.registry_scope():
        ag.register_rule("cmp_around", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
        with pytest.raises(ag.GroupError, match=r"group 'cmp_around' .* torch\.compile'd graph"):
            ag.autograd_group("cmp_around")(compiled_norm)(leaf(ROWS))
    assert ag.groups.lifecycle.open_instances() == []


def test_a_nan_safe_group_dividing_by_a_number_compiles_into_one_graph():
    """The structure's decisions read no fake value while the graph is traced (issue 30): a quotient
    by a number is then hooked, and the gradients equal the eager ones."""
    with ag.registry_scope():
        ag.register_rule("cmp_ns", ag.NanSafe())

        @ag.autograd_group("cmp_ns")
        def f(x):
            return torch.where(x > 0, torch.log(x) * (x / 6) + x ** 2, 0.0)

        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        assert_same(grads(compiled, leaf([0.0, 1.0, 2.0])), grads(f, leaf([0.0, 1.0, 2.0])))
        assert torch.isfinite(grads(compiled, leaf([0.0, 1.0, 2.0]))[0]).all()

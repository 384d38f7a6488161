"""Groups compiled as their own region (``@ag.autograd_group(name, compile=...)``): the gradients of
the eager group at ordinary and special points, for each rule kind, the flag obeyed with one compile
per setting, ``torch.func`` and forward mode run eagerly with the same values, inlined inside an
outer compile, the budget's fallback, and ``stats``' counts of how the calls ran.

Compiles are slow on a small machine: the groups here compile with ``aot_eager`` (AOTAutograd's
joint graph, where the rules are recorded, without inductor's code generation), and are defined
once per module, so that their compiled graphs serve every test; one test compiles with the
default, inductor.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
from torch._dynamo.utils import counters

import autograd_groups as ag
from autograd_groups import RegionWarning

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compile")]

AOT = {"backend": "aot_eager"}


def length(v: torch.Tensor) -> torch.Tensor:
    return v.pow(2).sum(-1, keepdim=True).sqrt() * v


def entropy(p: torch.Tensor) -> torch.Tensor:
    return -torch.where(p > 0, p * p.log(), 0).sum(-1)


def length_double_where(v: torch.Tensor) -> torch.Tensor:
    """``length`` as written by hand to have a finite gradient at 0."""
    squared = v.pow(2).sum(-1, keepdim=True)
    zero = squared == 0
    return torch.where(zero, 0.0, torch.where(zero, 1.0, squared).sqrt()) * v


def saved_bytes(fn: Callable[..., torch.Tensor], x: torch.Tensor) -> int:
    """Bytes of the distinct storages ``fn`` saves for backward at ``x``."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x.detach().requires_grad_())
    return sum(storages.values())


def with_builtin(v: torch.Tensor) -> torch.Tensor:
    return ag.ops.vector_norm(v, dim=-1, keepdim=True) * v.sin()


def _override(name: str) -> None:
    @ag.special_case(name)
    def at_zero(ctx: ag.OverrideContext) -> torch.Tensor:
        return (ctx.outputs[0] == 0).any()

    @at_zero.backward
    def zero_grad(ctx: ag.OverrideContext, grad: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.zeros_like(ctx.inputs[0]),)


def _rules(name: str, kind: str) -> None:
    if kind == "subgradient":
        ag.register_rule(name, ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    elif kind == "nan_safe":
        ag.register_rule(name, ag.NanSafe())
    elif kind == "override":
        _override(name)


#: kind -> (body, the compiled group, the same group eager, an input holding special and ordinary rows)
CASES: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor], Callable[..., torch.Tensor],
                       list[list[float]]]] = {}
for _kind, _body, _rows in (
        ("subgradient", length, [[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]),
        ("nan_safe", entropy, [[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]),
        ("override", lambda v: v.pow(2).sum(-1).sqrt(), [[0.0, 0.0, 0.0], [1.0, 2.0, 2.0]]),
        ("builtin", with_builtin, [[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]])):
    CASES[_kind] = (_body, ag.autograd_group(f"region.{_kind}", compile=AOT)(_body),
                    ag.autograd_group(f"region.{_kind}.eager")(_body), _rows)


@pytest.fixture(autouse=True, scope="module")
def registered() -> Iterator[None]:
    """The cases' rules, for this module's tests only (other modules list the registry)."""
    with ag.registry_scope():
        for kind in CASES:
            _rules(f"region.{kind}", kind)
            _rules(f"region.{kind}.eager", kind)
        yield


@contextlib.contextmanager
def length_group(name: str, compile: object) -> Iterator[Callable[..., torch.Tensor]]:
    """``length`` as a new group ``name`` declared with ``compile``, its sqrt rule registered for the
    block."""
    grouped: Callable[..., torch.Tensor] = ag.autograd_group(name, compile=compile)(length)  # type: ignore[arg-type]
    with ag.registry_scope():
        _rules(name, "subgradient")
        yield grouped


def grad_of(fn: Callable[..., torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_()
    fn(x).sum().backward()
    assert x.grad is not None
    return x.grad


def region_calls(name: str) -> dict[str, object]:
    found: dict[str, object] = ag.stats()[name]["region"]
    return found


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", CASES)
def test_gradients_equal_the_eager_groups_at_special_and_ordinary_points(kind: str,
                                                                         dtype: torch.dtype) -> None:
    body, grouped, eager, rows = CASES[kind]
    x = torch.tensor(rows, dtype=dtype)
    ag.reset_stats()
    got, want = grad_of(grouped, x), grad_of(eager, x)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want)
    assert region_calls(f"region.{kind}")["compiled_calls"] == 1


def test_dynamic_shapes_compile_once_more_and_then_serve_every_batch() -> None:
    _, grouped, eager, rows = CASES["subgradient"]
    name = "region.subgradient"
    before = region_calls(name)["compiles"] if name in ag.stats() else None
    for batch in (3, 5, 9):
        x = torch.tensor(rows * batch, dtype=torch.float64)
        torch.testing.assert_close(grad_of(grouped, x), grad_of(eager, x))
    assert before is None or region_calls(name)["compiles"] - before <= 2


def test_the_flag_is_obeyed_at_every_call_with_one_compile_per_setting() -> None:
    x = torch.tensor(CASES["subgradient"][3], dtype=torch.float64)
    with length_group("region.flag", AOT) as grouped:
        plain = grad_of(length, x)  # the plain composite's gradient, as the running release gives it
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("error", RegionWarning)  # within its budget: no warning
            for enabled in (True, False, True, False):
                with ag.special_cases(enabled):
                    seen.append(grad_of(grouped, x))
        torch.testing.assert_close(seen[1], plain, equal_nan=True)
        torch.testing.assert_close(seen[3], plain, equal_nan=True)
        assert torch.isfinite(seen[0]).all() and torch.equal(seen[0], seen[2])
        assert region_calls("region.flag")["compiles"] == 2


def test_torch_func_and_forward_mode_run_the_eager_group_with_its_values() -> None:
    _, grouped, eager, rows = CASES["subgradient"]
    x = torch.tensor(rows, dtype=torch.float64)
    ag.reset_stats()

    def both(transform: Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]],
             *inputs: torch.Tensor) -> None:
        got = transform(lambda v: grouped(v).sum())(*inputs)
        want = transform(lambda v: eager(v).sum())(*inputs)
        torch.testing.assert_close(got, want, equal_nan=True)

    both(lambda f: torch.func.vmap(torch.func.grad(f)), x)
    both(lambda f: (lambda v: torch.func.jvp(f, (v,), (torch.ones_like(v),))), x)
    func = torch.func
    for point in (x[0], x[1]):  # the special row (|v| = 0), an ordinary one
        for outer in (func.jacrev, func.jacfwd):
            for inner in (func.jacrev, func.jacfwd):
                both(lambda f, outer=outer, inner=inner: outer(inner(f)), point)
        both(lambda f: (lambda v: func.jvp(lambda u: func.jvp(f, (u,), (torch.ones_like(u),))[1],
                                           (v,), (torch.ones_like(v),))), point)
    calls = region_calls("region.subgradient")
    assert calls["compiled_calls"] == 0
    assert set(calls["eager_calls"]) == {"torch.func transform"}  # type: ignore[arg-type]


def test_dual_numbers_run_the_eager_group() -> None:
    _, grouped, eager, rows = CASES["subgradient"]
    x = torch.tensor(rows, dtype=torch.float64)
    ag.reset_stats()
    tangents = []
    import torch.autograd.forward_ad as fwAD
    for fn in (grouped, eager):
        with fwAD.dual_level():
            tangents.append(fwAD.unpack_dual(fn(fwAD.make_dual(x, torch.ones_like(x)))).tangent)
    torch.testing.assert_close(tangents[0], tangents[1])
    assert region_calls("region.subgradient")["eager_calls"] == {"forward mode": 1}


def test_inside_an_outer_compile_the_group_is_inlined_with_no_graph_break() -> None:
    _, grouped, eager, rows = CASES["subgradient"]
    graphs: list[str] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        graphs.append(gm.code)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)  # type: ignore[no-any-return]

    def model(f: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def calls(v: torch.Tensor) -> torch.Tensor:
            for _ in range(3):
                v = f(v) + 1
            return v
        return calls

    counters.clear()
    x = torch.tensor(rows, dtype=torch.float64)
    got = grad_of(torch.compile(model(grouped), fullgraph=True, backend=keep), x)
    assert dict(counters["graph_break"]) == {}
    torch.testing.assert_close(got, grad_of(model(eager), x))
    assert torch.isfinite(got).all()
    assert "invoke_subgraph" not in graphs[0]


@pytest.mark.parametrize("calls", [1, 2])
def test_inside_an_outer_inductor_compile_values_and_gradients_are_the_eager_groups(calls: int) -> None:
    """Inductor's code for the whole model: the group's output is still its value after the
    backward, and the gradient is the eager group's (a group reused as a nested compile region
    had its output overwritten by the backward and a wrong gradient on torch 2.13, and did not
    compile where it was called once)."""
    grouped = ag.autograd_group(f"region.inductor.{calls}", compile=AOT)(torch.sqrt)
    eager = ag.autograd_group(f"region.inductor.{calls}.eager")(torch.sqrt)

    def model(f: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        return lambda v: f(v) * 2 + (f(v * 3) if calls == 2 else 0)

    x = torch.tensor([0.0, 1.0, 4.0])
    outputs = []
    with ag.registry_scope():
        for name in (f"region.inductor.{calls}", f"region.inductor.{calls}.eager"):
            ag.register_rule(name, ag.Subgradient(op="sqrt", when="result == 0", grad="grad * 2"))
        for fn in (torch.compile(model(grouped), fullgraph=True), model(eager)):
            v = x.clone().requires_grad_()
            out = fn(v)
            before = out.detach().clone()
            out.sum().backward()
            outputs.append((before, out.detach(), v.grad))
    (before, after, got), (want_out, _, want) = outputs
    torch.testing.assert_close(before, want_out)
    torch.testing.assert_close(after, want_out)
    torch.testing.assert_close(got, want)


def test_a_changed_registry_compiles_again_each_time_and_follows_the_rule() -> None:
    """The registry's generation is guarded by value: a third, fourth rule is not served by the
    graph of the second."""
    x = torch.tensor([0.0, 4.0], dtype=torch.float64)
    grouped = ag.autograd_group("region.generation", compile=AOT)(torch.sqrt)
    with ag.registry_scope():
        for k in (2.0, 3.0, 4.0, 5.0):
            ag.register_rule("region.generation", ag.Subgradient(op="sqrt", when="result == 0",
                                                                 grad=f"grad * {k}"), replace=True)
            assert grad_of(grouped, x).tolist() == [k, 0.25]


def test_a_setting_for_a_group_without_rules_or_equal_to_the_default_compiles_nothing() -> None:
    with length_group("region.settings", AOT) as grouped:
        x = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
        ag.reset_stats()
        first = grad_of(grouped, x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # no group is named "region.nothing"
            with ag.special_cases(False, groups=["region.nothing"]):
                assert torch.equal(grad_of(grouped, x), first)
        with ag.special_cases(True, groups=["region.settings"]):
            assert torch.equal(grad_of(grouped, x), first)
        assert region_calls("region.settings")["compiles"] == 1


def test_the_group_s_keyword_arguments_may_have_any_name() -> None:
    def scaled(v: torch.Tensor, flag_key: float = 1.0, generation: float = 1.0) -> torch.Tensor:
        return length(v) * flag_key * generation

    grouped = ag.autograd_group("region.names", compile=AOT)(scaled)
    with ag.registry_scope():
        _rules("region.names", "subgradient")
        x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
        got = grouped(x, flag_key=2.0, generation=3.0)
    torch.testing.assert_close(got, 6 * length(x))


def test_past_its_budget_a_group_runs_eagerly_and_says_so_once() -> None:
    rows = CASES["subgradient"][3]
    with length_group("region.budget", {**AOT, "budget": 1}) as grouped:
        ag.reset_stats()
        first = grad_of(grouped, torch.tensor(rows, dtype=torch.float64))
        told = (r"group 'region\.budget' \(compile=True\) runs eagerly at calls that would compile it "
                r"again: it has 1 compiled graphs")
        with pytest.warns(RegionWarning, match=told):
            other = grad_of(grouped, torch.tensor(rows, dtype=torch.float32))
        with warnings.catch_warnings():
            warnings.simplefilter("error", RegionWarning)
            again = grad_of(grouped, torch.tensor(rows, dtype=torch.float32))
            served = grad_of(grouped, torch.tensor(rows, dtype=torch.float64))
    torch.testing.assert_close(other, again)
    torch.testing.assert_close(other, first.float())
    torch.testing.assert_close(served, first)
    calls = region_calls("region.budget")
    assert {k: calls[k] for k in ("compiled_calls", "eager_calls", "compiles")} == {
        "compiled_calls": 2, "eager_calls": {"recompile budget spent": 2}, "compiles": 1}


def test_a_compile_the_backend_refuses_runs_eagerly_and_says_so_once() -> None:
    def refuse(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        raise RuntimeError("this backend compiles nothing")

    x = torch.tensor(CASES["subgradient"][3], dtype=torch.float64)
    with length_group("region.refused", {"backend": refuse}) as grouped:
        ag.reset_stats()
        with pytest.warns(RegionWarning, match=r"runs eagerly from now on: the compiler refused it "
                                               r"\(RuntimeError: this backend compiles nothing\)"):
            got = grad_of(grouped, x)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RegionWarning)
            grad_of(grouped, x)
    torch.testing.assert_close(got, grad_of(CASES["subgradient"][2], x))
    assert region_calls("region.refused")["eager_calls"] == {"compile refused": 2}


def test_an_error_of_the_users_code_is_raised_as_the_eager_group_raises_it() -> None:
    @ag.autograd_group("region.user_error", compile=AOT)
    def grouped(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        grouped(torch.ones(2, 3), torch.ones(2, 3))


def test_an_override_whose_check_reads_a_bool_runs_eagerly() -> None:
    @ag.autograd_group("region.bool_check", compile=AOT)
    def norm(v: torch.Tensor) -> torch.Tensor:
        return v.pow(2).sum(-1).sqrt()

    with ag.registry_scope():
        @ag.special_case("region.bool_check")
        def fires(ctx: ag.OverrideContext) -> bool:
            return bool((ctx.outputs[0] == 0).any())

        @fires.backward
        def zero(ctx: ag.OverrideContext, grad: torch.Tensor) -> tuple[torch.Tensor]:
            return (torch.zeros_like(ctx.inputs[0]),)

        ag.reset_stats()
        x = torch.tensor(CASES["override"][3], dtype=torch.float64)
        assert torch.equal(grad_of(norm, x)[0], torch.zeros(3, dtype=torch.float64))
    assert region_calls("region.bool_check")["eager_calls"] == {"override check not traceable": 1}


def test_a_trace_sees_the_group_it_runs_eagerly() -> None:
    _, grouped, _, rows = CASES["subgradient"]
    ag.reset_stats()
    with ag.trace() as session:
        grad_of(grouped, torch.tensor(rows, dtype=torch.float64))
    assert [i.name for i in session.instances] == ["region.subgradient"]
    assert region_calls("region.subgradient")["eager_calls"] == {"observed by trace or detect_nonfinite": 1}


def test_inductor_by_default() -> None:
    x = torch.tensor(CASES["subgradient"][3], dtype=torch.float32)
    with length_group("region.inductor", True) as grouped:
        ag.reset_stats()
        torch.testing.assert_close(grad_of(grouped, x), grad_of(CASES["subgradient"][2], x))
        calls = region_calls("region.inductor")
        assert {k: calls[k] for k in ("compiled_calls", "eager_calls", "compiles")} == {
            "compiled_calls": 1, "eager_calls": {}, "compiles": 1}
        # What the compiled region saved, no more than the hand-written double where saves eagerly.
        assert 0 < calls["saved_bytes"] <= saved_bytes(length_double_where, x)  # type: ignore[operator]


@pytest.mark.parametrize(("compile", "message"), [
    ({"backnd": "eager"}, r"group 'g': compile= has no option 'backnd': the options are backend, mode, "
                          r"dynamic, options, budget"),
    ({"budget": 0}, r"group 'g': compile= has budget 0: the budget is a number of compiled graphs"),
    ({"mode": "bogus"}, r"group 'g': compile= has mode 'bogus': torch.compile's modes are 'default', "),
    ({"dynamic": "maybe"}, r"group 'g': compile= has dynamic 'maybe': give True, False or None"),
    ({"options": 5}, r"group 'g': compile= has options 5: give a mapping of inductor's settings"),
    ({"mode": "default", "options": {}}, r"group 'g': compile= has both mode and options"),
    ("yes", r"group 'g': compile= is 'yes': give True, False, or a mapping of the options"),
])
def test_bad_options_are_refused_by_name(compile: object, message: str) -> None:
    with pytest.raises(ag.GroupError, match=message):
        ag.autograd_group("g", compile=compile)  # type: ignore[arg-type]


def test_a_with_block_cannot_be_compiled_as_a_region() -> None:
    with pytest.raises(ag.GroupError, match=r"group 'g': compile= compiles a decorated function"), \
            ag.autograd_group("g", compile=True):
        pass


SPEC = """
- name: region.spec(Tensor v) -> Tensor
  compile: {backend: aot_eager}
  special_cases:
    - subgradient: {op: sqrt, when: "result == 0", grad: 0}
"""


def test_a_spec_compiles_the_functions_of_its_group_while_it_is_loaded() -> None:
    @ag.autograd_group("region.spec")
    def grouped(v: torch.Tensor) -> torch.Tensor:
        return length(v)

    x = torch.tensor(CASES["subgradient"][3], dtype=torch.float64)
    ag.reset_stats()
    with ag.registry_scope(), ag.load_spec(SPEC):
        got = grad_of(grouped, x)
        assert region_calls("region.spec")["compiled_calls"] == 1
    torch.testing.assert_close(got, grad_of(CASES["subgradient"][2], x))
    grad_of(grouped, x)  # unloaded: an eager group again, as decorated
    assert region_calls("region.spec")["compiled_calls"] == 1


def test_a_decorator_s_own_compile_false_wins_over_a_spec() -> None:
    @ag.autograd_group("region.spec", compile=False)
    def grouped(v: torch.Tensor) -> torch.Tensor:
        return length(v)

    x = torch.tensor(CASES["subgradient"][3], dtype=torch.float64)
    ag.reset_stats()
    with ag.registry_scope(), ag.load_spec(SPEC):
        torch.testing.assert_close(grad_of(grouped, x), grad_of(CASES["subgradient"][2], x))
    assert "region" not in ag.stats()["region.spec"]


@pytest.mark.parametrize(("value", "message"), [
    ("{backnd: eager}", "'compile' has no option 'backnd': the options are backend, mode, dynamic, options, "
                        "budget"),
    ("{budget: -1}", "'compile' has budget -1: the budget is a number of compiled graphs, an int of 1 or "
                     "more"),
    ("[1, 2]", "'compile' is a list"),
    ("{mode: 3}", "'compile' has mode 3: torch.compile's modes are 'default', 'reduce-overhead', "
                  "'max-autotune', 'max-autotune-no-cudagraphs'"),
])
def test_a_specs_compile_is_checked(value: str, message: str) -> None:
    spec = f"- name: g(Tensor v) -> Tensor\n  compile: {value}\n  special_cases: [nan_safe: true]\n"
    assert [e[1:] for e in ag.check_spec(spec)] == [(2, 12, message)]


def _wrong_backward(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
    """A backend whose compiled backward is off by 1 %: a compiler's wrong gradient, made on purpose."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    def backward(graph: torch.fx.GraphModule, _: object) -> Callable[..., object]:
        def run(args: list[torch.Tensor]) -> list[object]:
            return [g * 1.01 if isinstance(g, torch.Tensor) else g for g in graph(*args)]
        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: make_boxed_func(g.forward),
                                 bw_compiler=backward)


@pytest.mark.parametrize("backend", ["aot_eager", _wrong_backward], ids=["right", "wrong"])
def test_verify_checks_the_compiled_region_against_the_eager_group(backend: object) -> None:
    with length_group("region.verified", {"backend": backend}) as grouped:
        report = ag.verify(lambda v: grouped(v).sum(), torch.tensor(CASES["subgradient"][3]))
    (row,) = [r for r in report.rows if r.rule == "compiled region"]
    rule_rows = [r.status for r in report.rows if r.rule != "compiled region"]
    assert rule_rows == ["consistent"]  # the eager rules, checked as always
    if backend == "aot_eager":
        assert row.status == "consistent" and row.difference == 0
    else:
        assert row.status == "inconsistent" and report.ok is False
        assert "its compiled region's gradient differs from the eager group's" in row.reason
        assert row.difference is not None and row.difference > row.tolerance  # type: ignore[operator]


def test_stats_keep_the_user_s_region_through_verify_and_count_every_function_of_the_group() -> None:
    def shifted(v: torch.Tensor) -> torch.Tensor:
        return length(v) + v

    with length_group("region.stats", AOT) as grouped:
        ag.reset_stats()
        for dtype in (torch.float32, torch.float64):
            grad_of(grouped, torch.tensor(CASES["subgradient"][3], dtype=dtype))
        before = region_calls("region.stats")
        assert before["compiles"] == 2
        ag.verify(lambda v: grouped(v).sum(), torch.zeros(1, 3, dtype=torch.float64))
        after = region_calls("region.stats")
        # verify's own compiled region is not the group's in stats; its runs of the user's
        # function at nearby points may compile the user's region once more.
        assert after["compiled_calls"] == before["compiled_calls"]
        assert after["compiles"] >= before["compiles"]
        other = ag.autograd_group("region.stats", compile=AOT)(shifted)
        grad_of(other, torch.ones(1, 3))
        assert region_calls("region.stats")["compiles"] == after["compiles"] + 1

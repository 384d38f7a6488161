"""Groups under PyTorch's autograd features: double backward, functional/func transforms,
checkpointing, grad modes, in-place ops, odd inputs and anomaly mode.

References are PyTorch's native ops where they exist, and otherwise "double-where" composites: the
special points masked out of the unsafe op's input and its output replaced by the subgradient,
which is differentiable to every order without a NaN.
"""

from __future__ import annotations

import pytest
import torch
from reliability_models import (
    cdist,
    euclidean_cdist,
    native_cdist,
    norm,
    points,
    power,
    register_rules,
    safe_norm,
    safe_power,
)
from torch.utils.checkpoint import checkpoint

import autograd_groups as ag

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _rules() -> None:
    register_rules()


def cdist_reference(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """Euclidean distances, 0 with gradient 0 for identical points, NaN-free to every order."""
    squared = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).pow(2).sum(-1)
    tie = squared == 0
    return torch.where(tie, 0.0, torch.where(tie, 1.0, squared).sqrt())


def power_reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``exp(y log x)``, 0 with gradient 0 at ``x = 0``, NaN-free to every order."""
    zero = x == 0
    return torch.where(zero, 0.0, torch.exp(y * torch.log(torch.where(zero, 1.0, x))))


def norm_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=-1)


def _ties() -> tuple[torch.Tensor, torch.Tensor]:
    return points(4, 3, 2, seed=0)


def _zero_base() -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor([0.0, 2.0, 0.5], dtype=torch.float64, requires_grad=True),
            torch.tensor([2.0, 3.0, 1.5], dtype=torch.float64, requires_grad=True))


def _zero_row() -> torch.Tensor:
    return torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=torch.float64, requires_grad=True)


def _assert_all_close(got: tuple[torch.Tensor | None, ...], want: tuple[torch.Tensor | None, ...]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g is not None and w is not None
        torch.testing.assert_close(g, w)


# -- double backward ---------------------------------------------------------------------------


def _second_order(fn, x1: torch.Tensor, x2: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A Hessian-vector product and a mixed derivative (through the incoming gradient ``w``)."""
    g = torch.autograd.grad(fn(x1, x2).sum(), (x1, x2), create_graph=True)
    hvp = torch.autograd.grad(sum(t.pow(2).sum() for t in g), (x1, x2))
    g1 = torch.autograd.grad((w * fn(x1, x2)).sum(), x1, create_graph=True)[0]
    return (*hvp, *torch.autograd.grad(g1.sum(), (w, x1)))


def test_double_backward_through_a_subgradient_equals_the_double_where_reference() -> None:
    x1, x2 = _ties()
    w = torch.linspace(1, 2, 12, dtype=torch.float64).reshape(4, 3).requires_grad_()
    assert any(t.isnan().any() for t in _second_order(euclidean_cdist, x1, x2, w))
    _assert_all_close(_second_order(cdist, x1, x2, w), _second_order(cdist_reference, x1, x2, w))
    a, b = torch.randn(4, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    assert torch.autograd.gradgradcheck(cdist, (a.requires_grad_(), b.requires_grad_()))


def test_double_backward_through_an_expression_grad_differentiates_the_expression() -> None:
    """The rule's ``grad`` is built from torch ops on ``grad``: its derivative is the expression's."""
    ag.register_rule("rel_relu", ag.Subgradient(op="clamp_min", when="self == 0", grad="grad * 0.5"))
    relu = ag.autograd_group("rel_relu")(lambda t: t.clamp_min(0))
    x = torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad((relu(x) * w).sum(), x, create_graph=True)
    torch.testing.assert_close(g, torch.tensor([1.0, 3.0, 0.0], dtype=torch.float64))
    (dw,) = torch.autograd.grad(g.sum(), w)
    torch.testing.assert_close(dw, torch.tensor([0.5, 1.0, 0.0], dtype=torch.float64))


def test_double_backward_through_nan_safe_equals_the_double_where_reference() -> None:
    def second(fn) -> tuple[torch.Tensor, ...]:
        x, y = _zero_base()
        g = torch.autograd.grad(fn(x, y).sum(), (x, y), create_graph=True)
        return torch.autograd.grad(sum(t.sum() for t in g), (x, y))

    assert any(t.isnan().any() for t in second(power))
    _assert_all_close(second(safe_power), second(power_reference))
    regular = tuple(t.detach()[1:].requires_grad_() for t in _zero_base())
    assert torch.autograd.gradgradcheck(safe_power, regular)


def test_double_backward_through_an_override_on_both_paths() -> None:
    # Under create_graph the replacement sees the inputs and outputs with their graph (the outputs
    # differentiable through the override), and the chain runs on the group's own subgraph: both are
    # differentiated as written. At the zero row the replacement's derivative is its own, 0, where
    # the norm's Hessian is undefined (native: NaN); off it, native's.
    x = _zero_row()
    (g,) = torch.autograd.grad(safe_norm(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g, torch.autograd.grad(norm_reference(x).sum(), x)[0])
    hessian = torch.autograd.functional.hessian
    ours = hessian(lambda t: safe_norm(t).sum(), x)
    native = hessian(lambda t: norm_reference(t).sum(), x)
    assert native[0, :, 0].isnan().all()
    torch.testing.assert_close(ours[0, :, 0], torch.zeros(2, 2, dtype=torch.float64))
    torch.testing.assert_close(ours[1, :, 1], native[1, :, 1])
    regular = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(safe_norm, (regular,))


def test_override_group_created_with_special_cases_off_is_twice_differentiable() -> None:
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    with ag.special_cases(False, groups=["rel_norm"]):
        assert torch.autograd.gradgradcheck(safe_norm, (x,))


# -- torch.autograd.functional and torch.func ---------------------------------------------------


@pytest.mark.parametrize("vectorize", [False, True])
def test_functional_jacobian_equals_reference_for_every_rule_kind(vectorize: bool) -> None:
    jacobian = torch.autograd.functional.jacobian
    x1, x2 = (t.detach() for t in _ties())
    _assert_all_close(jacobian(cdist, (x1, x2), vectorize=vectorize),
                      jacobian(native_cdist, (x1, x2), vectorize=vectorize))
    x = _zero_row().detach()
    torch.testing.assert_close(jacobian(safe_norm, x, vectorize=vectorize), jacobian(norm_reference, x))
    base = tuple(t.detach() for t in _zero_base())
    _assert_all_close(jacobian(safe_power, base, vectorize=vectorize), jacobian(power_reference, base))


def test_functional_hessian_through_a_subgradient_equals_reference() -> None:
    x1, x2 = (t.detach() for t in _ties())
    hessian = torch.autograd.functional.hessian

    def total(fn):
        return lambda a: fn(a, x2).sum()

    torch.testing.assert_close(hessian(total(cdist), x1), hessian(total(cdist_reference), x1))


def test_torch_func_transforms_over_a_subgradient_group_equal_native() -> None:
    x1, x2 = (t.detach() for t in _ties())
    func = torch.func
    _assert_all_close(func.grad(lambda a, b: cdist(a, b).sum(), argnums=(0, 1))(x1, x2),
                      func.grad(lambda a, b: native_cdist(a, b).sum(), argnums=(0, 1))(x1, x2))
    out, vjp = func.vjp(cdist, x1, x2)
    native_out, native_vjp = func.vjp(native_cdist, x1, x2)
    torch.testing.assert_close(out, native_out)
    cotangent = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    _assert_all_close(vjp(cotangent), native_vjp(cotangent))
    # (jacrev of torch.cdist itself is wrong under vmap in this PyTorch: compare with jacobian)
    _assert_all_close(func.jacrev(cdist, argnums=(0, 1))(x1, x2),
                      torch.autograd.functional.jacobian(native_cdist, (x1, x2)))
    torch.testing.assert_close(func.hessian(lambda a: cdist(a, x2).sum())(x1),
                               func.hessian(lambda a: cdist_reference(a, x2).sum())(x1))


def test_torch_func_transforms_over_nan_safe_equal_reference() -> None:
    x, y = (t.detach() for t in _zero_base())
    _assert_all_close(torch.func.grad(lambda a, b: safe_power(a, b).sum(), argnums=(0, 1))(x, y),
                      torch.func.grad(lambda a, b: power_reference(a, b).sum(), argnums=(0, 1))(x, y))


def test_torch_func_over_an_override_group_equals_reference() -> None:
    """torch.func runs an override group as one op whose vjp is where(check, replacement, automatic)
    (sites/tangents.py): grad, vjp, jacrev and vmap give the replacement where the check fires."""
    x = _zero_row().detach()
    func = torch.func
    _assert_all_close((func.grad(lambda t: safe_norm(t).sum())(x), func.jacrev(safe_norm)(x),
                       func.vjp(safe_norm, x)[1](torch.ones(2, dtype=x.dtype))[0], func.vmap(safe_norm)(x)),
                      (func.grad(lambda t: norm_reference(t).sum())(x), func.jacrev(norm_reference)(x),
                       func.vjp(norm_reference, x)[1](torch.ones(2, dtype=x.dtype))[0],
                       func.vmap(norm_reference)(x)))
    assert ag.groups.lifecycle.open_instances() == []


def test_torch_func_counts_an_override_s_firings_as_reverse_mode_does() -> None:
    x, y = torch.tensor([0.0, 2.0]), torch.tensor([2.0, 3.0])
    ag.reset_stats()
    torch.func.jacrev(ag.ops.pow)(x, y)
    torch.func.jacfwd(ag.ops.pow)(x + 1, y)
    rule = ag.stats()["ops.pow"]["rules"]["override(zero_base)"]
    assert (rule["calls"], rule["firings"]) == (2, 1)


def test_torch_func_over_an_override_group_keeps_its_subgradient_rules_not_linear_in_grad() -> None:
    # Only forward mode needs rules linear in grad; the override's vjp under jacrev takes any.
    with ag.registry_scope():
        ag.register_rule("mixed", ag.Subgradient(op="sqrt", when="result == 0", grad="abs(grad)"))
        ag.register_rule("mixed", ag.Override(check=lambda ctx: False, backward=lambda ctx, grad: grad))
        mixed = ag.autograd_group("mixed")(norm)
        x = _zero_row().detach()
        got = torch.func.jacrev(mixed)(x)
        want = torch.autograd.functional.jacobian(mixed, x)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want)


def test_a_check_that_reads_data_is_refused_by_name_once_vmap_batches_it() -> None:
    # vmap over grad: the check's bool() meets a batched tensor; a check returning a bool tensor
    # (ops.pow's) is taken by torch.where instead.
    with pytest.raises(ag.RuleError, match=r"group 'rel_norm' .* the check raised .* Under vmap"):
        torch.func.vmap(torch.func.grad(safe_norm))(_zero_row().detach())
    assert ag.groups.lifecycle.open_instances() == []


def test_torch_func_reverse_over_reverse_through_a_subgradient_equals_reference() -> None:
    """Each torch.func grad transform records its own graph: the rule is hooked onto every one, and
    the derivative formula is made NaN-safe in the graphs of the transforms around the backward."""
    x1, x2 = (t.detach() for t in _ties())
    want = torch.autograd.functional.hessian(lambda a: cdist_reference(a, x2).sum(), x1)
    func = torch.func
    got = func.jacrev(func.jacrev(lambda a: cdist(a, x2).sum()))(x1)
    torch.testing.assert_close(got, want)
    row = func.grad(lambda a: func.grad(lambda b: cdist(b, x2).sum())(a)[0, 1])(x1)
    torch.testing.assert_close(row, want[0, 1])


def test_torch_func_reverse_over_reverse_through_nan_safe_equals_reference() -> None:
    x, y = (t.detach() for t in _zero_base())
    hessian = torch.autograd.functional.hessian
    got = torch.func.jacrev(torch.func.jacrev(lambda a: safe_power(a, y).sum()))(x)
    torch.testing.assert_close(got, hessian(lambda a: power_reference(a, y).sum(), x))


def test_a_group_under_vmap_then_backward_applies_its_rule() -> None:
    """Under vmap the group's outputs are batched wrappers with no grad_fn; plain autograd records
    the graph on the tensors they wrap."""
    x1, x2 = _ties()
    torch.func.vmap(lambda row: cdist(row[None], x2))(x1).sum().backward()
    got = x1.grad
    x1.grad = None
    native_cdist(x1, x2).sum().backward()
    assert got is not None and not got.isnan().any()
    torch.testing.assert_close(got, x1.grad)


def test_a_group_under_vmap_inside_grad_applies_its_rule() -> None:
    """Under vmap the group's outputs are batched wrappers with no grad_fn of their own: the rule
    is hooked onto the graph of the grad transform outside."""
    x1, x2 = (t.detach() for t in _ties())
    got = torch.func.grad(lambda a: torch.func.vmap(lambda row: cdist(row[None], x2))(a).sum())(x1)
    want = torch.func.grad(lambda a: native_cdist(a, x2).sum())(x1)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want)


def _tagged_norm(x: torch.Tensor) -> torch.Tensor:
    squared = ag.tag(ag.tag(x.pow(2), "rel_cdist").sum(-1), "rel_cdist")
    return ag.tag(squared.sqrt(), "rel_cdist")


def _norm_reference(x: torch.Tensor) -> torch.Tensor:
    squared = x.pow(2).sum(-1)
    zero = squared == 0
    return torch.where(zero, 0.0, torch.where(zero, 1.0, squared).sqrt())


def test_tagged_ops_under_torch_func_transforms() -> None:
    """tag() marks the op's node in every grad transform level's graph, as the decorator does."""
    x = _zero_row().detach()
    func = torch.func
    want = func.jacrev(func.jacrev(lambda a: _norm_reference(a).sum()))(x)
    torch.testing.assert_close(func.jacrev(func.jacrev(lambda a: _tagged_norm(a).sum()))(x), want)
    batched = x.clone().requires_grad_()
    func.vmap(_tagged_norm)(batched).sum().backward()
    torch.testing.assert_close(batched.grad, func.grad(lambda a: _norm_reference(a).sum())(x))


def test_forward_mode_gives_the_transpose_of_the_rules() -> None:
    """Forward-mode AD (jacfwd) takes the group's tangents from its rule-corrected reverse mode
    (tests/test_forward_mode.py has the full matrix)."""
    x1, x2 = (t.detach() for t in _ties())
    got = torch.func.jacfwd(cdist, argnums=(0, 1))(x1, x2)
    want = torch.func.jacrev(cdist, argnums=(0, 1))(x1, x2)
    assert torch.func.jacfwd(euclidean_cdist)(x1, x2).isnan().any()
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w)


# -- checkpointing ------------------------------------------------------------------------------


def _loss(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """All three rule kinds in one loss; every one of them fires at these inputs."""
    return (cdist(x1, x2).sum() + safe_norm(x1 - x2[:1]).sum()
            + safe_power((x1 - x2[:1]).abs(), torch.full_like(x1, 2.0)).sum())


def _grads_of(loss_fn, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    for t in inputs:
        t.grad = None
    loss_fn(*inputs).backward()
    return tuple(t.grad for t in inputs)  # type: ignore[misc]


def test_reentrant_checkpoint_gives_the_uncheckpointed_gradients() -> None:
    x1, x2 = _ties()
    want = _grads_of(_loss, x1, x2)
    assert not any(g.isnan().any() for g in want)
    _assert_all_close(_grads_of(lambda a, b: checkpoint(_loss, a, b, use_reentrant=True), x1, x2), want)


def test_reentrant_checkpoint_reads_the_flag_when_it_recomputes() -> None:
    """The recompute, in the backward, creates the group instances: the flag is read then."""
    x1, x2 = _ties()
    with ag.special_cases(False):
        loss = checkpoint(_loss, x1, x2, use_reentrant=True)
    loss.backward()
    assert not x1.grad.isnan().any()
    with ag.special_cases(False):
        loss = checkpoint(_loss, x1, x2, use_reentrant=True)
        x1.grad = None
        loss.backward()
    assert x1.grad.isnan().any()


def test_non_reentrant_checkpoint_gives_the_uncheckpointed_gradients() -> None:
    """The subgradient rule reads the op's saved result after the op's own backward did, which
    non-reentrant checkpoint allows once per pass: the group's saved-tensor hooks allow it twice."""
    x1, x2 = _ties()
    want = _grads_of(_loss, x1, x2)
    _assert_all_close(_grads_of(lambda a, b: checkpoint(_loss, a, b, use_reentrant=False), x1, x2), want)


def test_non_reentrant_checkpoint_recomputes_the_groups_in_the_backward() -> None:
    x1, x2 = _ties()
    ag.reset_stats()
    loss = checkpoint(cdist, x1, x2, use_reentrant=False).sum()
    assert ag.stats()["rel_cdist"]["instances"] == 1
    loss.backward()
    assert ag.stats()["rel_cdist"]["instances"] == 2
    assert ag.stats()["rel_cdist"]["rules"]["subgradient(sqrt: result == 0 -> 0)"]["calls"] == 1
    assert not x1.grad.isnan().any()


def test_non_reentrant_checkpoint_backward_twice_with_retain_graph() -> None:
    x1, x2 = _ties()
    want = tuple(g.clone() for g in _grads_of(_loss, x1, x2))
    x1.grad = x2.grad = None
    loss = checkpoint(_loss, x1, x2, use_reentrant=False)
    loss.backward(retain_graph=True)
    loss.backward()
    _assert_all_close((x1.grad / 2, x2.grad / 2), want)


def test_saved_tensor_hooks_around_a_group_see_each_saved_value_once() -> None:
    """The group's hooks pack with the user's hooks, once per saved value, as without the group."""
    x1, x2 = _ties()
    packed: list[int] = []
    for group in (cdist, euclidean_cdist):
        packed.append(0)

        def pack(t: torch.Tensor) -> torch.Tensor:
            packed[-1] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            group(x1, x2).sum().backward()
    assert packed[0] == packed[1] > 0
    with torch.autograd.graph.save_on_cpu():
        got = _grads_of(_loss, x1, x2)
    _assert_all_close(got, _grads_of(_loss, x1, x2))


def test_non_reentrant_checkpoint_of_a_tagged_rule_reading_saved_values_raises_a_clear_error() -> None:
    """tag() marks an op after it saved its values, through the checkpoint's hooks alone."""
    x1, x2 = _ties()

    def tagged(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        squared = (a.unsqueeze(-2) - b.unsqueeze(-3)).pow(2).sum(-1)
        return ag.tag(squared.clamp_min(0).sqrt(), "rel_cdist")

    with pytest.raises(ag.RuleError, match=r"group 'rel_cdist' .* at op sqrt: cannot read the op's "
                                           r"saved 'result' .* mark this group with @autograd_group"):
        checkpoint(tagged, x1, x2, use_reentrant=False).sum().backward()


# -- grad modes and inputs that do not require grad ----------------------------------------------


def test_no_grad_and_inference_mode_around_groups() -> None:
    x1, x2 = _ties()
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            outs = (cdist(x1, x2), safe_norm(x1), safe_power(x1.abs(), x2[:1].abs()))
        wants = (euclidean_cdist(x1, x2), norm(x1), power(x1.abs(), x2[:1].abs()))
        for out, want in zip(outs, wants):
            assert not out.requires_grad
            torch.testing.assert_close(out, want.detach(), equal_nan=True)


def test_no_grad_inside_a_group_is_obeyed() -> None:
    def partial(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            anchor = x2 * 1.0
        return euclidean_cdist(x1, anchor)

    def in_block(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        with ag.autograd_group("rel_cdist"):
            return partial(x1, x2)

    x1, x2 = _ties()
    want = torch.autograd.grad(native_cdist(x1, x2.detach()).sum(), x1)
    for fn in (ag.autograd_group("rel_cdist")(partial), in_block):
        got = torch.autograd.grad(fn(x1, x2).sum(), (x1, x2), allow_unused=True)
        assert got[1] is None
        _assert_all_close(got[:1], want)


def test_inference_tensors_inside_a_group_fail_as_in_plain_pytorch() -> None:
    def uses_inference_tensor(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            c = x.detach() * 2
        return x * c

    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        uses_inference_tensor(x)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        ag.autograd_group("rel_cdist")(uses_inference_tensor)(x)
    assert ag.groups.lifecycle.open_instances() == []


def test_inputs_that_do_not_require_grad() -> None:
    x1, x2 = _ties()
    (g1,) = torch.autograd.grad(cdist(x1, x2.detach()).sum(), x1)
    torch.testing.assert_close(g1, torch.autograd.grad(native_cdist(x1, x2.detach()).sum(), x1)[0])
    plain = (cdist(x1.detach(), x2.detach()), safe_norm(x1.detach()),
             safe_power(x1.detach().abs(), x2.detach()[:1].abs()))
    for out, want in zip(plain, (euclidean_cdist(x1, x2), norm(x1), power(x1.abs(), x2[:1].abs()))):
        assert not out.requires_grad and out.grad_fn is None
        torch.testing.assert_close(out, want.detach(), equal_nan=True)


# -- in-place ops after the group ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["subgradient", "override", "nan_safe"])
def test_in_place_op_on_a_saved_output_raises_the_version_counter_error(kind: str) -> None:
    x1, x2 = _ties()
    grouped, plain = {"subgradient": (cdist, euclidean_cdist),
                      "override": (lambda a, b: safe_norm(a), lambda a, b: norm(a)),
                      "nan_safe": (lambda a, b: safe_power(a.abs(), b[:1].abs()),
                                   lambda a, b: power(a.abs(), b[:1].abs()))}[kind]
    for fn in (plain, grouped):
        out = fn(x1, x2)
        out.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_in_place_op_on_an_override_groups_input_raises_the_version_counter_error() -> None:
    x = _zero_row()
    for fn in (norm, safe_norm):
        shifted = x * 1.0
        out = fn(shifted)
        shifted.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_allowed_in_place_op_on_a_group_output_gives_pytorchs_gradient() -> None:
    scaled = ag.autograd_group("rel_cdist")(lambda a, b: euclidean_cdist(a, b) * 1.0)
    x1, x2 = _ties()
    out = scaled(x1, x2)
    out.mul_(3.0)
    got = torch.autograd.grad(out.sum(), (x1, x2))
    _assert_all_close(got, tuple(3.0 * g for g in torch.autograd.grad(native_cdist(x1, x2).sum(), (x1, x2))))


# -- odd inputs -------------------------------------------------------------------------------------


def test_empty_tensors() -> None:
    e1 = torch.zeros(0, 3, dtype=torch.float64, requires_grad=True)
    e2 = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    _assert_all_close(torch.autograd.grad(cdist(e1, e2).sum(), (e1, e2)),
                      torch.autograd.grad(native_cdist(e1, e2).sum(), (e1, e2)))
    (g,) = torch.autograd.grad(safe_norm(e1).sum(), e1)
    assert g.shape == (0, 3)
    y = torch.zeros(0, 3, dtype=torch.float64, requires_grad=True)
    got = torch.autograd.grad(safe_power(e1, y).sum(), (e1, y))
    assert [tuple(t.shape) for t in got] == [(0, 3), (0, 3)]


def test_integer_inputs_give_the_plain_values() -> None:
    a, b = torch.tensor([[0, 1], [3, 4]]), torch.tensor([[0, 1], [6, 8]])
    torch.testing.assert_close(cdist(a, b), euclidean_cdist(a, b))
    torch.testing.assert_close(safe_norm(a), norm(a))
    torch.testing.assert_close(safe_power(a, b), power(a, b), equal_nan=True)
    with pytest.raises(RuntimeError, match="floating point"):
        a.requires_grad_()


def test_complex_inputs() -> None:
    """A subgradient rule works on complex tensors; ops without complex support fail as in PyTorch."""
    ag.register_rule("rel_complex", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    grouped = ag.autograd_group("rel_complex")(norm)
    z = torch.tensor([[1 + 1j, 2 - 1j], [0j, 0j]], dtype=torch.complex128, requires_grad=True)
    (got,) = torch.autograd.grad(grouped(z).abs().sum(), z)
    (want,) = torch.autograd.grad(norm(z).abs().sum(), z)
    assert want[1].isnan().all()
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], torch.zeros_like(got[1]))
    clamped = lambda t: t.clamp_min(0).sqrt()  # noqa: E731
    with pytest.raises(RuntimeError) as plain:
        clamped(z)
    with pytest.raises(RuntimeError) as grouped_error:
        ag.autograd_group("rel_complex")(clamped)(z)
    assert str(grouped_error.value) == str(plain.value) and "complex" in str(plain.value)
    assert ag.groups.lifecycle.open_instances() == []


# -- anomaly mode -----------------------------------------------------------------------------------


def test_detect_anomaly_on_top_of_groups() -> None:
    x1, x2 = _ties()
    with torch.autograd.detect_anomaly():
        got = _grads_of(_loss, x1, x2)
    _assert_all_close(got, _grads_of(_loss, x1, x2))
    with (torch.autograd.detect_anomaly(), ag.special_cases(False),
          pytest.raises(RuntimeError, match="returned nan values")):
        _loss(x1, x2).backward()

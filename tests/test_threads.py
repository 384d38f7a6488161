"""Threads: the flag is per thread and recorded at forward; ``during="backward"`` is per backward pass.

Every worker compares each of its gradients with a reference computed single-threaded beforehand,
exactly (same ops, same inputs: bit-identical results, NaN in the same places).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
from reliability_models import cdist, euclidean_cdist, native_cdist, norm, points, register_rules, safe_norm
from torch.utils.checkpoint import checkpoint

import autograd_groups as ag

THREADS = 8
ITERATIONS = 200

Grads = tuple[torch.Tensor, ...]


@pytest.fixture(autouse=True)
def _rules() -> None:
    register_rules()


def _cdist_grads(fn: Callable[..., torch.Tensor], x1: torch.Tensor, x2: torch.Tensor) -> Grads:
    return torch.autograd.grad(fn(x1, x2).sum(), (x1, x2))


def _same(got: Grads, want: Grads) -> bool:
    return all(torch.equal(g.nan_to_num(7.0), w.nan_to_num(7.0)) and torch.equal(g.isnan(), w.isnan())
               for g, w in zip(got, want))


def _run_threads(work: Callable[[int], int]) -> list[int]:
    """Run ``work(k)`` in THREADS threads released together; return each one's mismatch count."""
    barrier = threading.Barrier(THREADS)
    results: list[int | BaseException] = [0] * THREADS

    def target(k: int) -> None:
        try:
            barrier.wait()
            results[k] = work(k)
        except BaseException as e:  # re-raised in the test's thread below
            results[k] = e

    threads = [threading.Thread(target=target, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return [int(r) for r in results]  # type: ignore[arg-type]


def _inputs(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return points(6, 5, 3, seed=k)


def test_concurrent_threads_match_single_threaded_reference() -> None:
    """8 threads x 200 forward+backward passes; even threads with special cases on, odd ones off."""
    enabled = [k % 2 == 0 for k in range(THREADS)]
    inputs = [_inputs(k) for k in range(THREADS)]
    reference = []
    for k, (x1, x2) in enumerate(inputs):
        with ag.special_cases(enabled[k]):
            reference.append(_cdist_grads(cdist, x1, x2))
        if enabled[k]:
            for got, want in zip(reference[k], _cdist_grads(native_cdist, x1, x2)):
                torch.testing.assert_close(got, want)
        else:
            plain = _cdist_grads(euclidean_cdist, x1, x2)
            assert all(g.isnan().any() for g in plain)
            assert _same(reference[k], plain)

    def work(k: int) -> int:
        x1, x2 = inputs[k]
        mismatches = 0
        for _ in range(ITERATIONS):
            if enabled[k]:
                got = _cdist_grads(cdist, x1, x2)
            else:
                with ag.special_cases(False):
                    got = _cdist_grads(cdist, x1, x2)
            mismatches += not _same(got, reference[k])
        return mismatches

    assert _run_threads(work) == [0] * THREADS
    assert ag.is_special_cases_enabled()


def test_forward_decision_holds_when_backward_runs_in_another_thread() -> None:
    x1, x2 = _inputs(0)
    with ag.special_cases(False):
        off = cdist(x1, x2).sum()
    on = cdist(x1, x2).sum()
    found: dict[str, Grads] = {}

    def backward_elsewhere() -> None:
        found["off"] = torch.autograd.grad(off, (x1, x2))
        ag.set_special_cases(False)  # this thread's forward flag must not matter to `on`
        found["on"] = torch.autograd.grad(on, (x1, x2))

    thread = threading.Thread(target=backward_elsewhere)
    thread.start()
    thread.join()
    assert _same(found["off"], _cdist_grads(euclidean_cdist, x1, x2))
    assert all(g.isnan().any() for g in found["off"])
    for got, want in zip(found["on"], _cdist_grads(native_cdist, x1, x2)):
        torch.testing.assert_close(got, want)


def test_forward_in_another_thread_keeps_that_threads_flag() -> None:
    x1, x2 = _inputs(1)
    made: dict[str, torch.Tensor] = {}

    def forward_elsewhere() -> None:
        ag.set_special_cases(False)
        made["off"] = cdist(x1, x2).sum()

    thread = threading.Thread(target=forward_elsewhere)
    thread.start()
    thread.join()
    assert ag.is_special_cases_enabled()
    assert _same(torch.autograd.grad(made["off"], (x1, x2)), _cdist_grads(euclidean_cdist, x1, x2))


def _loss(x1: torch.Tensor, x2: torch.Tensor, plain: bool = False) -> torch.Tensor:
    """A subgradient group and an override group in one loss."""
    if plain:
        return euclidean_cdist(x1, x2).sum() + norm(x1 - x2[:1]).sum()
    return cdist(x1, x2).sum() + safe_norm(x1 - x2[:1]).sum()


def test_during_backward_applies_per_backward_pass_under_concurrency() -> None:
    """Forward with rules on everywhere; even threads run their backward passes inside
    ``special_cases(False, during="backward")``, odd ones outside any block, all at once: each pass
    obeys only the block of the thread that started it."""
    inputs = [_inputs(k) for k in range(THREADS)]
    on = [torch.autograd.grad(_loss(x1, x2), (x1, x2)) for x1, x2 in inputs]
    off = [torch.autograd.grad(_loss(x1, x2, plain=True), (x1, x2)) for x1, x2 in inputs]
    assert all(not g.isnan().any() for grads in on for g in grads)
    assert all(g.isnan().any() for grads in off for g in grads)

    def work(k: int) -> int:
        x1, x2 = inputs[k]
        mismatches = 0
        for _ in range(ITERATIONS // 2):
            loss = _loss(x1, x2)
            if k % 2 == 0:
                with ag.special_cases(False, during="backward"):
                    got = torch.autograd.grad(loss, (x1, x2))
                mismatches += not _same(got, off[k])
            else:
                mismatches += not _same(torch.autograd.grad(loss, (x1, x2)), on[k])
        return mismatches

    assert _run_threads(work) == [0] * THREADS


def test_during_backward_covers_a_pass_started_in_the_block_whatever_made_the_graph() -> None:
    x1, x2 = _inputs(2)
    made: dict[str, torch.Tensor] = {}
    thread = threading.Thread(target=lambda: made.setdefault("loss", _loss(x1, x2)))
    thread.start()
    thread.join()
    with ag.special_cases(False, during="backward"):
        got = torch.autograd.grad(made["loss"], (x1, x2))
    assert _same(got, torch.autograd.grad(_loss(x1, x2, plain=True), (x1, x2)))


def test_during_backward_is_not_inherited_by_threads_started_in_the_block() -> None:
    x1, x2 = _inputs(3)
    loss = _loss(x1, x2)
    found: dict[str, Grads] = {}
    with ag.special_cases(False, during="backward"):
        thread = threading.Thread(
            target=lambda: found.setdefault("grads", torch.autograd.grad(loss, (x1, x2))))
        thread.start()
        thread.join()
    assert _same(found["grads"], torch.autograd.grad(_loss(x1, x2), (x1, x2)))
    assert not any(g.isnan().any() for g in found["grads"])


def test_during_backward_reaches_nested_backward_passes() -> None:
    """A reentrant checkpoint runs its own backward pass inside the outer one: it inherits the
    block's state, as every pass started (directly or not) from the block does."""
    x1, x2 = _inputs(4)
    loss = checkpoint(_loss, x1, x2, use_reentrant=True)
    with ag.special_cases(False, during="backward"):
        loss.backward()
    assert _same((x1.grad, x2.grad), torch.autograd.grad(_loss(x1, x2, plain=True), (x1, x2)))


def test_concurrent_non_reentrant_checkpoints_match_the_reference() -> None:
    """Saved-tensor hooks are per thread: each thread's checkpointed group keeps its own values."""
    inputs = [_inputs(k) for k in range(THREADS)]
    reference = [_cdist_grads(native_cdist, x1, x2) for x1, x2 in inputs]

    def work(k: int) -> int:
        x1, x2 = inputs[k]
        checkpointed = lambda a, b: checkpoint(cdist, a, b, use_reentrant=False)  # noqa: E731
        return sum(not torch.allclose(g, w) for _ in range(ITERATIONS // 4)
                   for g, w in zip(_cdist_grads(checkpointed, x1, x2), reference[k]))

    assert _run_threads(work) == [0] * THREADS

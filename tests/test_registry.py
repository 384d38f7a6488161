"""The registry: ordered, introspectable, thread-safe, undoable."""

from __future__ import annotations

import threading

import torch

import autograd_groups as ag


def test_rules_are_listed_in_registration_order():
    rules = [ag.Subgradient(op="sqrt", when="result == 0", grad=0), ag.NanSafe(),
             ag.Subgradient(op="log", when="self == 0", grad=0)]
    for rule in rules:
        ag.register_rule("g", rule)
    assert ag.list_rules()["g"] == tuple(rules)
    ag.unregister_rule("g", rules[1])
    assert ag.list_rules()["g"] == (rules[0], rules[2])


def test_registry_scope_undoes_registrations():
    with ag.registry_scope():
        ag.register_rule("temporary", ag.NanSafe())
        assert "temporary" in ag.list_rules()
    assert "temporary" not in ag.list_rules()


def test_registering_while_another_thread_runs_backward(cdist_example):
    failures: list[BaseException] = []
    stop = threading.Event()
    x1 = torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float64)

    def train():
        try:
            while not stop.is_set():
                a = x1.clone().requires_grad_()
                cdist_example.grouped_cdist(a, x1.clone()).sum().backward()
                assert torch.isfinite(a.grad).all()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)

    def register(offset: int):
        for k in range(100):
            ag.register_rule("stress", ag.Subgradient(op="sqrt", when=f"result == {offset + k}"))

    trainer = threading.Thread(target=train)
    trainer.start()
    writers = [threading.Thread(target=register, args=(1000 * w,)) for w in range(3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    trainer.join()
    assert failures == []
    assert len(ag.list_rules()["stress"]) == 300

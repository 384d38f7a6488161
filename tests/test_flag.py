"""The special-cases flag: forward-recorded, backward-scoped, per group, threads, nesting."""

from __future__ import annotations

import re
import threading
import warnings

import pytest
import torch

import autograd_groups as ag
from autograd_groups.sites import hooks
from conftest import line_of


@pytest.fixture
def points() -> tuple[torch.Tensor, torch.Tensor]:
    x1 = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 4.0]], dtype=torch.float64)
    x2 = torch.tensor([[0.0, 1.0], [5.0, 5.0]], dtype=torch.float64)
    return x1, x2


def loss_and_inputs(fn, points):
    x1, x2 = (p.clone().requires_grad_() for p in points)
    return fn(x1, x2).sum(), x1, x2


def grad_x1(fn, points) -> torch.Tensor:
    loss, x1, _ = loss_and_inputs(fn, points)
    loss.backward()
    return x1.grad


def node_classes(out: torch.Tensor) -> list[str]:
    """The classes of every node reachable from ``out``, in walk order."""
    seen, order, stack = set(), [], [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        stack.extend(child for child, _ in node.next_functions)
    return [type(n).__name__ for n in order], order


def test_off_at_forward_is_exactly_plain_autograd(direct_cdist, points):
    plain = grad_x1(direct_cdist.euclidean_cdist, points)
    with ag.special_cases(False):
        off = grad_x1(direct_cdist.grouped_cdist, points)
    assert plain.isnan().any()
    torch.testing.assert_close(off, plain, equal_nan=True, rtol=0, atol=0)


def test_off_installs_no_hook_and_no_wrapper(direct_cdist, points, monkeypatch):
    made = []
    original = hooks.SiteHook.__init__

    def counting_init(self, *args, **kwargs):
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(hooks.SiteHook, "__init__", counting_init)
    x1, x2 = (p.clone().requires_grad_() for p in points)
    with ag.special_cases(False):
        off_out = direct_cdist.grouped_cdist(x1, x2)
    plain_classes, _ = node_classes(direct_cdist.euclidean_cdist(x1, x2))
    off_classes, off_nodes = node_classes(off_out)
    assert off_classes == plain_classes  # no extra node: no autograd.Function wrapper
    assert all("autograd_groups" not in n.metadata for n in off_nodes)
    assert made == []
    on_out = direct_cdist.grouped_cdist(x1, x2)
    _, on_nodes = node_classes(on_out)
    # The same introspection does see the rule site when special cases are on.
    assert len(made) == 1 and any("autograd_groups" in n.metadata for n in on_nodes)


def test_decision_recorded_at_forward_holds_in_another_thread(direct_cdist, points):
    results = {}
    loss_on, x1_on, _ = loss_and_inputs(direct_cdist.grouped_cdist, points)
    with ag.special_cases(False):
        loss_off, x1_off, _ = loss_and_inputs(direct_cdist.grouped_cdist, points)

    def backward_elsewhere():
        ag.set_special_cases(False)  # the other thread's own setting must not matter
        loss_on.backward()
        ag.set_special_cases(True)
        loss_off.backward()
        results["done"] = True

    thread = threading.Thread(target=backward_elsewhere)
    thread.start()
    thread.join()
    assert results == {"done": True}
    assert torch.isfinite(x1_on.grad).all()
    assert x1_off.grad.isnan().any()


def test_during_backward_turns_off_rules_recorded_on(direct_cdist, points):
    plain = grad_x1(direct_cdist.euclidean_cdist, points)
    loss, x1, _ = loss_and_inputs(direct_cdist.grouped_cdist, points)
    with ag.special_cases(False, during="backward"):
        assert ag.is_special_cases_enabled()  # the forward-time flag is untouched
        loss.backward()
    torch.testing.assert_close(x1.grad, plain, equal_nan=True, rtol=0, atol=0)
    # Outside the block the next backward pass applies the rules again.
    assert torch.isfinite(grad_x1(direct_cdist.grouped_cdist, points)).all()


def test_during_backward_for_other_groups_leaves_this_one_on(direct_cdist, points):
    loss, x1, _ = loss_and_inputs(direct_cdist.grouped_cdist, points)
    with pytest.warns(UserWarning, match="no group is named 'elsewhere'"):
        scope = ag.special_cases(False, groups=["elsewhere"], during="backward")
    with scope:
        loss.backward()
    assert torch.isfinite(x1.grad).all()


def test_groups_selects_which_groups_are_off(direct_cdist, points):
    ag.register_rule("cdist2", direct_cdist.SQRT_AT_ZERO)
    other = ag.autograd_group("cdist2")(direct_cdist.euclidean_cdist)
    with ag.special_cases(False, groups=["cdist"]):
        assert not ag.is_special_cases_enabled("cdist") and ag.is_special_cases_enabled("cdist2")
        off = grad_x1(direct_cdist.grouped_cdist, points)
        on = grad_x1(other, points)
    assert off.isnan().any() and torch.isfinite(on).all()


def test_nested_blocks_restore_the_previous_state():
    assert ag.is_special_cases_enabled()
    with ag.special_cases(False):
        with ag.special_cases(True, groups=["a"]):
            assert ag.is_special_cases_enabled("a") and not ag.is_special_cases_enabled("b")
            with ag.special_cases(True):
                assert ag.is_special_cases_enabled("b")
            assert not ag.is_special_cases_enabled("b")
        assert not ag.is_special_cases_enabled("a")
    assert ag.is_special_cases_enabled() and ag.is_special_cases_enabled("a")


def test_state_is_restored_when_the_block_raises():
    with pytest.raises(KeyError), ag.special_cases(False):
        raise KeyError
    assert ag.is_special_cases_enabled()


def test_decorator_form(direct_cdist, points):
    @ag.special_cases(False)
    def forward_off(x1, x2):
        assert not ag.is_special_cases_enabled()
        return direct_cdist.grouped_cdist(x1, x2)

    assert grad_x1(forward_off, points).isnan().any()
    assert ag.is_special_cases_enabled()
    assert torch.isfinite(grad_x1(direct_cdist.grouped_cdist, points)).all()


def test_a_decorated_generator_has_the_setting_at_each_resume_only(direct_cdist, points):
    # As torch.no_grad: the body runs with the setting at every resume, the caller between resumes
    # without it; close and throw reach the body inside the setting too.
    seen = []

    @ag.special_cases(False)
    def steps():
        try:
            while True:
                seen.append(ag.is_special_cases_enabled())
                yield grad_x1(direct_cdist.grouped_cdist, points)
        except KeyError:
            seen.append(ag.is_special_cases_enabled())
            yield None
        finally:
            seen.append(ag.is_special_cases_enabled())

    gen = steps()
    assert seen == [] and ag.is_special_cases_enabled()
    assert next(gen).isnan().any()  # the group made in the body recorded "off"
    assert ag.is_special_cases_enabled() and torch.isfinite(grad_x1(direct_cdist.grouped_cdist, points)).all()
    assert next(gen).isnan().any()
    assert gen.throw(KeyError) is None
    gen.close()
    assert seen == [False, False, False, False] and ag.is_special_cases_enabled()


def test_a_decorated_generator_returns_its_value() -> None:
    @ag.special_cases(False)
    def counted():
        yield 1
        return "done"

    gen = counted()
    assert next(gen) == 1
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == "done"


def test_flag_is_thread_local():
    seen = {}
    ag.set_special_cases(False)
    thread = threading.Thread(target=lambda: seen.setdefault("other", ag.is_special_cases_enabled()))
    thread.start()
    thread.join()
    assert seen == {"other": True} and not ag.is_special_cases_enabled()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="during='sideways'"):
        ag.special_cases(False, during="sideways")
    with pytest.raises(TypeError, match=r"groups=\['cdist'\]"):
        ag.special_cases(False, groups="cdist")


# Typos are errors, or at least warnings.

@pytest.mark.parametrize("enabled", ["off", "False", 0, 1, None])
def test_enabled_must_be_a_bool(enabled):
    message = re.escape(f"special_cases(enabled): enabled must be True or False, not {enabled!r}")
    with pytest.raises(TypeError, match=message):
        ag.special_cases(enabled)
    with pytest.raises(TypeError, match=message):
        ag.set_special_cases(enabled)
    assert ag.is_special_cases_enabled()


def test_the_override_decorator_given_a_bool_says_which_function_was_meant():
    with pytest.raises(TypeError, match=re.escape(
            "special_case(group) is the decorator of an override rule and takes a group name, not False "
            "(to turn special cases on or off, use ag.special_cases(enabled), plural)")):
        ag.special_case(False)  # type: ignore[arg-type]  # as in `with ag.special_case(False):`


def test_an_unknown_group_name_warns_once_naming_the_close_matches():
    ag.register_rule("zq_spacing_rule", ag.NanSafe())
    ag.autograd_group("declared_rows")  # a group without rules is a known name too
    with pytest.warns(UserWarning) as record:
        ag.set_special_cases(False, groups=["zq_spacing_rulle", "zq_spacing_rule", "declared_rows"])  # typo
    assert not ag.is_special_cases_enabled("zq_spacing_rulle")
    assert [str(w.message) for w in record] == [
        "special_cases(..., groups=[...]): no group is named 'zq_spacing_rulle': no rule is registered under "
        "it and no autograd_group or tag has used it, so the setting changes nothing for it; did you mean "
        "'zq_spacing_rule'?"]
    assert (record[0].filename, record[0].lineno) == (__file__, line_of(__file__, "# typo"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ag.set_special_cases(False, groups=["zq_spacing_rulle"])  # warned once already
    with pytest.raises(TypeError, match="not one holding 3"):
        ag.special_cases(False, groups=[3])  # type: ignore[list-item]


def test_stats_show_a_group_with_no_rules_registered():
    ag.register_rule("spelled_right", ag.NanSafe())
    x = torch.ones(2, requires_grad=True)
    ag.autograd_group("spelled_rihgt")(torch.sqrt)(x).sum().backward()
    ag.autograd_group("spelled_right")(torch.sqrt)(x).sum().backward()
    stats = ag.stats()
    assert stats["spelled_rihgt"]["registered"] is False and stats["spelled_rihgt"]["instances"] == 1
    assert stats["spelled_right"]["registered"] is True

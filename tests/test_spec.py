"""Spec files drive the same rules as the Python API: same gradients, merged loads, clean undo."""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import autograd_groups as ag
from autograd_groups.rules import expr
from autograd_groups.spec import loader
from conftest import ROOT

SPECS = ROOT / "examples" / "specs"


def native_cdist(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    return torch.cdist(x1, x2, compute_mode="donot_use_mm_for_euclid_dist")


def grads(fn, *inputs: torch.Tensor) -> list[torch.Tensor]:
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    out.backward(torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) % 5 + 1)
    return [x.grad for x in leaves]


def points() -> tuple[torch.Tensor, torch.Tensor]:
    """Integer-valued float64 points with duplicated rows: distance exactly 0 for those pairs."""
    g = torch.Generator().manual_seed(3)
    x1 = torch.randint(-4, 5, (7, 3), generator=g).double()
    x2 = torch.randint(-4, 5, (6, 3), generator=g).double()
    x2[:3] = x1[1:4]
    x1[5] = x1[0]
    return x1, x2


def test_cdist_spec_gives_exactly_the_gradients_of_the_python_rule() -> None:
    import direct_cdist as cdist  # NaN at zero distances on every release: the rule matters

    x1, x2 = points()
    plain = grads(cdist.euclidean_cdist, x1, x2)
    assert plain[0].isnan().any(), "without a rule the composite must be NaN at the duplicated rows"
    with ag.registry_scope():
        cdist.register()
        from_python = grads(cdist.grouped_cdist, x1, x2)
    with ag.registry_scope():
        handle = ag.load_spec(SPECS / "cdist.yaml")
        assert [g.name for g in handle.groups] == ["cdist"]
        from_spec = grads(cdist.grouped_cdist, x1, x2)
    reference = grads(native_cdist, x1, x2)
    for spec_grad, python_grad, torch_grad in zip(from_spec, from_python, reference):
        assert torch.isfinite(spec_grad).all()
        assert torch.equal(spec_grad, python_grad)
        torch.testing.assert_close(spec_grad, torch_grad)


def test_nan_safe_spec_matches_torch_pow_at_zero() -> None:
    base = torch.tensor([0.0, 0.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    exponent = torch.tensor([2.0, 3.0, 1.5, 0.5, 2.0], dtype=torch.float64)
    composite = ag.autograd_group("pow_composite")(lambda s, e: torch.exp(e * torch.log(s)))
    assert grads(composite, base, exponent)[0][:2].isnan().all(), "no rule loaded: NaN at base 0"
    ag.load_spec(SPECS / "pow_composite.yaml")
    for ours, theirs in zip(grads(composite, base, exponent), grads(torch.pow, base, exponent)):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)


def test_override_spec_matches_vector_norm_at_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SPECS))
    handle = ag.load_spec(SPECS / "safe_norm.yaml")
    (rule,) = handle.groups[0].rules
    assert isinstance(rule, ag.Override) and rule.check.__name__ == "norm_is_zero"
    norm = ag.autograd_group("safe_norm")(lambda x: x.pow(2).sum().sqrt())
    for x in (torch.zeros(4, dtype=torch.float64), torch.tensor([3.0, -4.0, 0.0], dtype=torch.float64)):
        (ours,) = grads(norm, x)
        (theirs,) = grads(torch.linalg.vector_norm, x)
        torch.testing.assert_close(ours, theirs)


def test_the_same_spec_as_text_path_str_and_package_resource(tmp_path: Path) -> None:
    text = (SPECS / "cdist.yaml").read_text()
    archive = tmp_path / "specs.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("pkg/cdist.yaml", text)
    resource = zipfile.Path(archive, "pkg/cdist.yaml")
    for source, label in [(text, "<string>"), (SPECS / "cdist.yaml", str(SPECS / "cdist.yaml")),
                          (str(SPECS / "cdist.yaml"), str(SPECS / "cdist.yaml")), (resource, str(resource))]:
        with ag.load_spec(source) as handle:
            assert handle.source == label
            (group,) = handle.groups
            assert (group.name, group.signature, group.where) == (
                "cdist", "cdist(Tensor x1, Tensor x2) -> Tensor", f"{label}:4:9")
            assert group.params == (("Tensor", "x1"), ("Tensor", "x2")) and group.returns == "Tensor"
            assert [r.label for r in ag.list_rules()["cdist"]] == ["subgradient(sqrt: result == 0 -> 0)"]
        assert "cdist" not in ag.list_rules()


def test_a_str_without_newline_is_a_path() -> None:
    with pytest.raises(ag.SpecError) as info:
        ag.load_spec("[nan_safe: true]")
    assert info.value.errors == [("[nan_safe: true]", 1, 1, "no such spec file (YAML text must contain a "
                                                              "newline to be read as text rather than as a "
                                                              "path)")]


def test_several_files_merge_and_each_handle_unloads_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SPECS))
    before = ag.list_rules()
    first = ag.load_spec(SPECS / "cdist.yaml")
    second = ag.load_spec(SPECS / "pow_composite.yaml")
    third = ag.load_spec(SPECS / "safe_norm.yaml")
    rules = ag.list_rules()
    assert {"cdist", "pow_composite", "safe_norm"} <= set(rules)
    assert [r.kind for r in rules["pow_composite"]] == ["nan_safe"]
    ag.unload_spec(second)
    assert "pow_composite" not in ag.list_rules() and {"cdist", "safe_norm"} <= set(ag.list_rules())
    first.unload()
    third.unload()
    third.unload()  # a second unload finds nothing left to remove
    assert ag.list_rules() == before


def test_registry_scope_undoes_a_load_and_a_later_unload_is_harmless() -> None:
    with ag.registry_scope():
        handle = ag.load_spec(SPECS / "cdist.yaml")
        assert "cdist" in ag.list_rules()
    assert "cdist" not in ag.list_rules()
    handle.unload()
    ag.load_spec(SPECS / "cdist.yaml")  # the name is free again
    assert "cdist" in ag.list_rules()


def test_an_invalid_spec_registers_nothing() -> None:
    spec = ("- name: fine(Tensor x) -> Tensor\n  special_cases: [nan_safe: true]\n"
            "- name: broken(Tensor x) -> Tensor\n  special_cases: [subgradient: {op: sqrt, when: x == 0}]\n")
    before = ag.list_rules()
    with pytest.raises(ag.SpecError) as info:
        ag.load_spec(spec)
    assert [(line, col) for _, line, col, _ in info.value.errors] == [(4, 49)]
    assert ag.list_rules() == before


def test_a_registration_that_fails_midway_is_rolled_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread registers group 'b' between the checks and the registration of this spec."""
    spec = ("- name: a(Tensor x) -> Tensor\n  special_cases: [nan_safe: true]\n"
            "- name: b(Tensor x) -> Tensor\n  special_cases: [nan_safe: true]\n")
    real = loader.registry.set_groups
    intruder = ag.NanSafe(doc="the intruder")

    def racing(groups: list[tuple[str, tuple[ag.NanSafe, ...], tuple[str, ...]]], replace: bool) -> object:
        real([("b", (intruder,), ("elsewhere:1",))], False)
        return real(groups, replace)

    monkeypatch.setattr(loader.registry, "set_groups", racing)
    with pytest.raises(ag.SpecError) as info:
        ag.load_spec(spec)
    assert info.value.errors == [("<string>", 3, 9, "group 'b' (from <string>:4:19) already has other rules, "
                                                     "registered at elsewhere:1; pass replace=True to swap "
                                                     "them")]
    assert "a" not in ag.list_rules() and ag.list_rules()["b"] == (intruder,)


def test_rules_keep_their_docs_and_list_knows_their_origin() -> None:
    spec = ("- name: documented(Tensor x, float eps=1e-6) -> (Tensor out, Tensor aux)\n"
            "  doc: a group doc\n"
            "  special_cases:\n"
            "    - subgradient: {op: pow, when: self == 0, grad: 0, input: 1, doc: a rule doc}\n"
            "    - nan_safe: {doc: another}\n")
    handle = ag.load_spec(spec)
    (group,) = handle.groups
    assert (group.doc, group.returns) == ("a group doc", "(Tensor out, Tensor aux)")
    assert group.params == (("Tensor", "x"), ("float", "eps"))
    subgradient, nan_safe = ag.list_rules()["documented"]
    assert (subgradient.doc, subgradient.input, nan_safe.doc) == ("a rule doc", 1, "another")
    assert loader.origin(subgradient) is group and loader.origin(nan_safe) is group
    assert loader.origin(ag.NanSafe()) is None


def test_check_spec_registers_nothing_and_checks_files_together() -> None:
    assert ag.check_spec(SPECS / "cdist.yaml", SPECS / "pow_composite.yaml") == []
    assert "cdist" not in ag.list_rules()
    errors = ag.check_spec(SPECS / "cdist.yaml", SPECS / "cdist.yaml")
    where = f"{SPECS / 'cdist.yaml'}:4:9"
    assert errors == [(str(SPECS / "cdist.yaml"), 4, 9, f"group 'cdist' is defined twice; first at {where}")]


def test_documented_functions_are_exactly_the_expression_functions() -> None:
    page = (ROOT / "docs" / "spec-format.md").read_text()
    section = page.split("## Functions", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `(\w+)\(", section, flags=re.MULTILINE)
    assert sorted(documented) == sorted(expr.FUNCTIONS)
    assert len(documented) == len(set(documented))


def test_documented_keys_are_exactly_the_schema_keys() -> None:
    from autograd_groups.spec import schema

    page = (ROOT / "docs" / "spec-format.md").read_text()
    section = page.split("## Keys", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([\w.]+)`", section, flags=re.MULTILINE))
    expected = ({*schema.GROUP_KEYS} | {f"subgradient.{k}" for k in schema.SUBGRADIENT_KEYS}
                | {f"override.{k}" for k in schema.OVERRIDE_KEYS} | {"nan_safe", "nan_safe.doc"}
                | {"subgradient", "override"})
    assert documented == expected



# A notebook cell that loads a spec may run again; replace=True swaps a group's rules.

def test_loading_the_same_spec_again_is_a_no_op(tmp_path: Path) -> None:
    path = tmp_path / "groups.yaml"
    path.write_text("- name: g(Tensor x) -> Tensor\n  special_cases:\n"
                    "    - subgradient: {op: sqrt, when: 'result == 0', grad: 0}\n    - nan_safe: true\n")
    first = ag.load_spec(path)
    rules = ag.list_rules()["g"]
    generation = loader.registry.generation()
    second = ag.load_spec(path)
    assert ag.list_rules()["g"] == rules and second.groups[0].rules == rules
    assert loader.registry.generation() == generation
    ag.load_spec(path.read_text())  # the same rules as text: no-op too
    assert ag.list_rules()["g"] == rules
    first.unload()
    assert "g" not in ag.list_rules()


def test_replace_swaps_the_rules_of_a_loaded_group(tmp_path: Path) -> None:
    path = tmp_path / "groups.yaml"
    path.write_text(subgradient_spec(grad="grad * 2"))
    ag.load_spec(path)
    path.write_text(subgradient_spec(grad=0))  # edited, then the cell runs again
    with pytest.raises(ag.SpecError, match="already registered by the spec at .* with other rules"):
        ag.load_spec(path)
    handle = ag.load_spec(path, replace=True)
    (rule,) = ag.list_rules()["g"]
    assert handle.groups[0].rules == (rule,) and rule.grad == 0
    x = torch.zeros(2, requires_grad=True)
    ag.autograd_group("g")(lambda x: x.sqrt())(x).sum().backward()
    assert torch.equal(x.grad, torch.zeros(2))


def subgradient_spec(grad: int | str) -> str:
    return ("- name: g(Tensor x) -> Tensor\n  special_cases:\n"
            f"    - subgradient: {{op: sqrt, when: result == 0, grad: {grad}}}\n")


def test_override_modules_are_imported_from_the_spec_folder_first(tmp_path: Path) -> None:
    (tmp_path / "ag_folder_rules.py").write_text(
        "import torch\n\ndef fires(ctx):\n    return True\n\n"
        "def zero(ctx, grad):\n    return torch.zeros_like(ctx.inputs[0])\n")
    path = tmp_path / "groups.yaml"
    path.write_text("- name: g(Tensor x) -> Tensor\n  special_cases:\n"
                    "    - override: {check: 'ag_folder_rules:fires', backward: 'ag_folder_rules:zero'}\n")
    handle = ag.load_spec(path)
    assert str(tmp_path) not in sys.path  # put first only while importing
    (rule,) = handle.groups[0].rules
    assert rule.check.__module__ == "ag_folder_rules"


def test_check_finds_a_submodule_without_running_its_package(tmp_path: Path) -> None:
    package = tmp_path / "ag_runs_when_imported"
    package.mkdir()
    marker = tmp_path / "ran"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (package / "rules.py").write_text("def check(ctx):\n    return True\n")
    spec = tmp_path / "groups.yaml"
    spec.write_text("- name: g(Tensor x) -> Tensor\n  special_cases:\n"
                    "    - override: {check: 'ag_runs_when_imported.rules:check', "
                    "backward: 'ag_runs_when_imported.nothing:backward'}\n")
    checked = loader.check([spec], imports="find")
    assert [(line, message.split(" (")[0]) for _, line, _, message in checked.errors] == [
        (3, f"'backward': cannot find module 'ag_runs_when_imported.nothing' in the spec's folder {tmp_path} "
            f"and sys.path")]
    assert not marker.exists() and "ag_runs_when_imported" not in sys.modules

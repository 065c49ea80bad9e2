"""The role's gate table and the kubelet stand-in's are written apart (the stand-in models Kubernetes, the role
decides); both are checked here against Kubernetes' own feature-gate history (fixtures/feature_gate_history.yml,
transcribed from kubernetes/website's feature-gate pages), so that a wrong entry cannot agree with itself: for every
minor release from 1.0 to 1.40, whether the kubelet knows each gate, its default, and whether it is locked."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_gates as kg

HERE = Path(__file__).resolve().parent
STANDIN = HERE.parents[1] / "kubelet_standin" / "kubelet_standin.py"
HISTORY = yaml.safe_load((HERE / "fixtures" / "feature_gate_history.yml").read_text())["gates"]
MINORS = [(1, minor) for minor in range(41)]


def load_standin():
    spec = importlib.util.spec_from_file_location("kubelet_standin", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def minor(text: str) -> tuple[int, int]:
    major, number = text.split(".")
    return int(major), int(number)


def history(gate: str, version: tuple[int, int]) -> tuple[bool, bool | None, bool | None]:
    """(known, default, locked) of `gate` in kubelet `version`, as the fixture says."""
    entry = HISTORY[gate]
    found = None
    for stage in entry["stages"]:
        start = minor(stage["fromVersion"])
        end = minor(stage["toVersion"]) if "toVersion" in stage else (99, 0)
        if start <= version <= end:
            found = stage
    known = found is not None
    default = bool(found.get("defaultValue", False)) if found else None
    locked = bool(found.get("locked", False)) if found else None
    for note in entry.get("kubelet", []):
        if minor(note["fromVersion"]) <= version <= minor(note["toVersion"]):
            assert note["source"]
            if note.get("known") is False:
                known, default, locked = False, None, None
            if "locked" in note and known:
                locked = note["locked"]
    return known, default, locked


def test_every_fixture_gate_names_its_source_commit():
    for gate, entry in HISTORY.items():
        assert len(entry["commit"]) == 40, gate
        assert entry["stages"], gate


@pytest.mark.parametrize("gate", sorted(kg.TABLE))
def test_the_role_table_agrees_with_kubernetes_history(gate):
    assert gate in HISTORY, f"{gate} is in the role's table but not in the fixture of Kubernetes' history"
    table = kg.build_table()
    for version in MINORS:
        stage = kg.stage_at(table, gate, version)
        got = (False, None, None) if stage is None else (True, stage.default, stage.locked)
        assert got == history(gate, version), f"{gate} in kubelet {version[0]}.{version[1]}"


@pytest.mark.parametrize("gate", sorted(load_standin().GATES))
def test_the_standin_table_agrees_with_kubernetes_history(gate):
    standin = load_standin()
    assert gate in HISTORY, f"{gate} is in the stand-in's table but not in the fixture of Kubernetes' history"
    for version in MINORS:
        stage = standin.stage_at(gate, version)
        got = (False, None, None) if stage is None else (True, stage[2], stage[3])
        assert got == history(gate, version), f"{gate} in kubelet {version[0]}.{version[1]}"


def test_the_gates_both_tables_list_are_all_checked():
    both = set(kg.TABLE) & set(load_standin().GATES)
    assert both == {"Accelerators", "DevicePlugins", "DevicePluginCDIDevices"}
    assert both <= set(HISTORY)

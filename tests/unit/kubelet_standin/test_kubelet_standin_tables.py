"""The role's gate table and the kubelet stand-in's own table are kept apart (the stand-in models Kubernetes, the
role decides); this check catches a slip in either: for every minor release from 1.6 to 1.36 they must agree on
whether the kubelet knows each gate the collection touches, its default and its lock."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_gates as kg

STANDIN = Path(__file__).resolve().parents[2] / "kubelet_standin" / "kubelet_standin.py"


def load_standin():
    spec = importlib.util.spec_from_file_location("kubelet_standin", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gate", sorted(kg.TABLE))
def test_tables_agree(gate):
    standin = load_standin()
    table = kg.build_table()
    for minor in range(6, 37):
        role = kg.stage_at(table, gate, (1, minor))
        model = standin.stage_at(gate, (1, minor))
        assert (role is None) == (model is None), f"{gate} 1.{minor}"
        if role is not None:
            assert (role.default, role.locked) == (model[2], model[3]), f"{gate} 1.{minor}"

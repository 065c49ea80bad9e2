"""The k3s/rke2 stand-in reads config.yaml and config.yaml.d as k3s documents it, and the role's planner merges
kubelet-arg the same way (both are written from k3s' documentation, separately; this check catches a slip in
either), and the stand-in refuses the gates the kubelet stand-in refuses."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_embedded as ke

FOLDER = Path(__file__).resolve().parents[2] / "kubelet_standin"

FILES = {
    "config.yaml": "token: x\nkubelet-arg:\n  - max-pods=10\n  - feature-gates=A=true\n",
    "config.yaml.d/10-a.yaml": "kubelet-arg+:\n  - feature-gates=B=false\n",
    "config.yaml.d/20-b.yaml": "node-label: [x=y]\n",
    "config.yaml.d/30-c.yaml": "kubelet-arg+: feature-gates=C=true\n",
    "config.yaml.d/notes.txt": "kubelet-arg: [ignored=1]\n",
}


@pytest.fixture(name="standin")
def fixture_standin():
    sys.path.insert(0, str(FOLDER))
    try:
        spec = importlib.util.spec_from_file_location("k3s_standin", FOLDER / "k3s_standin.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(FOLDER))


def test_standin_and_planner_merge_kubelet_arg_alike(standin, tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    merged = standin.merged_config(str(tmp_path / "config.yaml"))
    ordered = ["config.yaml", "config.yaml.d/10-a.yaml", "config.yaml.d/20-b.yaml", "config.yaml.d/30-c.yaml"]
    role = ke.merged_args([(name, yaml.safe_load(FILES[name])) for name in ordered])
    assert (
        merged["kubelet-arg"]
        == role
        == [
            "max-pods=10",
            "feature-gates=A=true",
            "feature-gates=B=false",
            "feature-gates=C=true",
        ]
    )
    (tmp_path / "config.yaml.d/40-d.yaml").write_text("kubelet-arg: []\n")
    assert standin.merged_config(str(tmp_path / "config.yaml"))["kubelet-arg"] == []


def test_standin_refuses_a_removed_gate_in_kubelet_arg(standin, tmp_path, monkeypatch, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("kubelet-arg:\n  - feature-gates=DevicePlugins=true\n")
    monkeypatch.setattr(standin, "read_version", lambda name: ("v1.30.4+k3s1", "1.30.4", (1, 30)))
    monkeypatch.setattr(standin.ks, "serve", lambda *args, **kwargs: pytest.fail("it must not run"))
    with pytest.raises(SystemExit) as exited:
        standin.main("k3s", ["server", "--config", str(config)])
    assert exited.value.code == 1
    assert "unrecognized feature gate: DevicePlugins" in capsys.readouterr().err

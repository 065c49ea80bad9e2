"""The kubelet stand-in reads what the real kubelet reads in what the molecule scenario relies on: a JSON config as
well as YAML, healthzPort/healthzBindAddress with the --healthz-* flags over them, and kubeadm 1.8's flags."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "kubelet_standin"


@pytest.fixture(name="standin")
def fixture_standin():
    spec = importlib.util.spec_from_file_location("kubelet_standin", FOLDER / "kubelet_standin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_json_and_yaml_configs(standin, tmp_path):
    (tmp_path / "c.json").write_text('{"kind": "KubeletConfiguration", "featureGates": {"DevicePlugins": true}}\n')
    (tmp_path / "c.yaml").write_text("featureGates: {DevicePlugins: false}  # flow style\nhealthzPort: 10255\n")
    assert standin.load_config(str(tmp_path / "c.json")) == {"DevicePlugins": True}
    assert standin.load_doc(str(tmp_path / "c.yaml")) == {
        "featureGates": {"DevicePlugins": False},
        "healthzPort": 10255,
    }


def test_health_address_flags_over_files(standin):
    docs = [{"healthzPort": 10255, "healthzBindAddress": "0.0.0.0"}, {"healthzPort": 10257}]
    assert standin.healthz_address([], {}) == ("127.0.0.1", 10248)
    assert standin.healthz_address(docs, {}) == ("0.0.0.0", 10257)
    assert standin.healthz_address(docs, {"--healthz-port": "10266"}) == ("0.0.0.0", 10266)


def test_kubeadm_18_flags_are_known(standin):
    text = (FOLDER / "10-kubeadm-1.8.conf").read_text()
    flags = set(re.findall(r"--[a-z-]+", text))
    assert len(flags) == 15 and flags <= standin.VALUE_FLAGS | standin.BOOL_FLAGS

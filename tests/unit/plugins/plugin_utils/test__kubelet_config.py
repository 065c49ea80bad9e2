"""KubeletConfiguration files: YAML (block and flow featureGates) and JSON, edited in place with every other byte kept;
the health endpoint from the file and the flags."""

from __future__ import annotations

import json

import pytest
import yaml
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_config as kc

PATH = "/etc/kubernetes/kubelet/kubelet-config.json"

# As EKS' AL2 bootstrap writes /etc/kubernetes/kubelet/kubelet-config.json (two-space JSON), plus a gate set by hand.
EKS_JSON = """{
  "kind": "KubeletConfiguration",
  "apiVersion": "kubelet.config.k8s.io/v1beta1",
  "address": "0.0.0.0",
  "authentication": {
    "anonymous": {
      "enabled": false
    }
  },
  "clusterDomain": "cluster.local",
  "featureGates": {
    "RotateKubeletServerCertificate": true,
    "DevicePlugins": true
  },
  "healthzBindAddress": "127.0.0.1",
  "healthzPort": 10248,
  "serverTLSBootstrap": true
}
"""


def test_json_gate_taken_out_as_json_every_other_byte_kept():
    text, rewritten = kc.set_config_gates(EKS_JSON, PATH, {"RotateKubeletServerCertificate": True})
    assert not rewritten
    assert text == EKS_JSON.replace(',\n    "DevicePlugins": true', "")
    assert json.loads(text)["featureGates"] == {"RotateKubeletServerCertificate": True}


def test_json_gate_added_and_changed_in_place():
    text, _rewritten = kc.set_config_gates(
        EKS_JSON, PATH, {"RotateKubeletServerCertificate": False, "DevicePlugins": True, "X": True}
    )
    assert text == EKS_JSON.replace(
        '"RotateKubeletServerCertificate": true', '"RotateKubeletServerCertificate": false'
    ).replace('"DevicePlugins": true', '"DevicePlugins": true,\n    "X": true')


def test_json_feature_gates_left_empty_goes_and_a_new_one_is_added_in_the_file_s_style():
    without, _rewritten = kc.set_config_gates(EKS_JSON, PATH, {})
    assert '"featureGates"' not in without and json.loads(without)["serverTLSBootstrap"] is True
    assert without.startswith('{\n  "kind"') and without.endswith('"serverTLSBootstrap": true\n}\n')
    again, _rewritten = kc.set_config_gates(without, PATH, {"DevicePlugins": True})
    assert again.endswith('"serverTLSBootstrap": true,\n  "featureGates": {\n    "DevicePlugins": true\n  }\n}\n')
    one_line, _rewritten = kc.set_config_gates('{"kind": "KubeletConfiguration"}', PATH, {"A": True})
    assert one_line == '{"kind": "KubeletConfiguration", "featureGates": {"A": true}}'


def test_json_is_read_as_json():
    assert kc.config_gates(EKS_JSON, PATH) == {"RotateKubeletServerCertificate": True, "DevicePlugins": True}
    with pytest.raises(kc.ConfigError, match=r"is not valid JSON or YAML"):
        kc.load_config('{"kind": "KubeletConfiguration",\n  "featureGates": {"A": true}\n', PATH)


FLOW = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# GPU nodes: set by hand in 2017, keep
featureGates: {DevicePlugins: true, CPUManagerPolicyAlphaOptions: true}  # see ticket 42
cgroupDriver: systemd  # must match containerd
"""


def test_flow_style_gates_are_edited_in_place_and_comments_kept():
    text, rewritten = kc.set_config_gates(FLOW, "/var/lib/kubelet/config.yaml", {"CPUManagerPolicyAlphaOptions": True})
    assert not rewritten
    assert text == FLOW.replace(
        "{DevicePlugins: true, CPUManagerPolicyAlphaOptions: true}", "{CPUManagerPolicyAlphaOptions: true}"
    )


def test_flow_style_over_several_lines_with_comments():
    text = "kind: KubeletConfiguration\nfeatureGates: {\n  A: true,  # first\n  B: false,\n}\nmaxPods: 10\n"
    edited, rewritten = kc.set_config_gates(text, "c.yaml", {"B": True, "C": True})
    assert not rewritten
    assert yaml.safe_load(edited)["featureGates"] == {"B": True, "C": True}
    assert edited == "kind: KubeletConfiguration\nfeatureGates: {\n  B: true,\n  C: true,\n}\nmaxPods: 10\n"
    emptied, rewritten = kc.set_config_gates(FLOW, "c.yaml", {})
    assert not rewritten and "# see ticket 42" in emptied and "featureGates: {}" in emptied


def test_block_style_is_edited_line_by_line():
    text = "kind: KubeletConfiguration\nfeatureGates:\n  DevicePlugins: true  # for the GPUs\n  A: true\nmaxPods: 10\n"
    edited, rewritten = kc.set_config_gates(text, "c.yaml", {"A": False})
    assert (edited, rewritten) == ("kind: KubeletConfiguration\nfeatureGates:\n  A: false\nmaxPods: 10\n", False)


@pytest.mark.parametrize(
    ("docs", "flags", "url"),
    [
        ([], {}, "http://127.0.0.1:10248/healthz"),
        ([("c", {"healthzPort": 10255})], {}, "http://127.0.0.1:10255/healthz"),
        (
            [("c", {"healthzPort": 10255, "healthzBindAddress": "0.0.0.0"})],
            {"--healthz-port": "10266"},
            "http://127.0.0.1:10266/healthz",
        ),
        ([("c", {"healthzPort": 10255}), ("d", {"healthzPort": 10257})], {}, "http://127.0.0.1:10257/healthz"),
        ([("c", {"healthzBindAddress": "::"})], {}, "http://[::1]:10248/healthz"),
        (
            [("c", {"healthzBindAddress": "10.0.0.5"})],
            {"--healthz-bind-address": "192.168.1.2"},
            "http://192.168.1.2:10248/healthz",
        ),
        ([("c", {"healthzPort": 0})], {}, None),
    ],
)
def test_health_endpoint_from_config_and_flags(docs, flags, url):
    assert kc.healthz(docs, flags).url() == url


def test_a_gate_that_is_not_a_boolean_is_refused_naming_file_and_gate():
    with pytest.raises(kc.ConfigError, match=r"c.yaml: featureGates.DevicePlugins is 'maybe', not true or false"):
        kc.load_config("featureGates:\n  DevicePlugins: maybe\n", "c.yaml")


def test_splices_refuse_overlaps():
    assert kc.apply_splices("abcdef", [(1, 3, ""), (3, 3, "X"), (5, 6, "Z")]) == "aXdeZ"
    with pytest.raises(ValueError, match="overlapping"):
        kc.apply_splices("abcdef", [(1, 4, ""), (3, 5, "")])

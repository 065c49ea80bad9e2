"""The k3s/rke2 (embedded kubelet) planner: kubelet-arg across config.yaml and its drop-ins, merged as k3s does."""

from __future__ import annotations

import pytest
import yaml
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_embedded as ke
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_gates as kg
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_settings as ks

TABLE = kg.build_table()
CONFIG = "/etc/rancher/k3s/config.yaml"
DROPIN = "/etc/rancher/k3s/config.yaml.d/50-gpu.yaml"
LATER = "/etc/rancher/k3s/config.yaml.d/90-site.yaml"
KUBELET_DROPIN = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/50-gpu.conf"
K3S_DEFAULTS = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/00-k3s-defaults.conf"

UPGRADED = """# k3s server on the GPU node, set up for the 1.9 days
token-file: /etc/rancher/k3s/token
node-label:
  - gpu=true
kubelet-arg:
  - "max-pods=200"
  - "feature-gates=DevicePlugins=true,CPUManagerPolicyAlphaOptions=true"  # by hand
  - 'image-gc-high-threshold=90'
write-kubeconfig-mode: "0600"
"""


def run_plan(version, texts, files=None, dropins=None, managed=None, user=None):
    layout = ke.Layout(config_files=files or [CONFIG], kubelet_dropins=dropins or [])
    return ke.plan(
        name="k3s",
        version=version,
        table=TABLE,
        managed={"DevicePlugins": True} if managed is None else managed,
        user=user or {},
        layout=layout,
        texts=texts,
    )


def apply(texts, planned):
    out = dict(texts)
    for change in planned.files:
        out[change["path"]] = change["content"]
    return out


def test_version_of_k3s_and_rke2():
    assert ke.embedded_version("k3s version v1.30.4+k3s1 (98262b5d)\ngo version go1.22.5\n", "k3s") == (1, 30)
    assert ke.embedded_version("rke2 version v1.31.1+rke2r1 (909d2...)\n", "rke2") == (1, 31)
    with pytest.raises(ks.PlanError, match="not 'k3s version"):
        ke.embedded_version("Kubernetes v1.30.2", "k3s")


def test_merge_replaces_and_appends_as_k3s_documents():
    docs = [
        ("a", {"kubelet-arg": ["x=1", "feature-gates=A=true"]}),
        ("b", {"kubelet-arg+": ["feature-gates=B=false"]}),
        ("c", {"node-label": ["y"]}),
    ]
    assert ke.merged_args(docs) == ["x=1", "feature-gates=A=true", "feature-gates=B=false"]
    assert ke.args_gates(ke.merged_args(docs)) == {"A": True, "B": False}
    docs.append(("d", {"kubelet-arg": "feature-gates=C=true"}))  # a later plain key replaces the whole list
    assert ke.merged_args(docs) == ["feature-gates=C=true"]
    assert ke.args_gates(["--feature-gates=A=true", "feature-gates=A=false"]) == {"A": False}


def test_1_30_removed_gate_is_taken_out_and_every_other_byte_kept():
    planned = run_plan((1, 30), {CONFIG: UPGRADED})
    assert planned.before == {"CPUManagerPolicyAlphaOptions": True, "DevicePlugins": True}
    assert planned.after == {"CPUManagerPolicyAlphaOptions": True}
    assert "DevicePlugins" in planned.removed and "removed in Kubernetes 1.28" in planned.removed["DevicePlugins"]
    assert "DevicePlugins" in planned.warnings[0]
    [change] = planned.files
    assert change["content"] == UPGRADED.replace(
        '  - "feature-gates=DevicePlugins=true,CPUManagerPolicyAlphaOptions=true"  # by hand\n',
        '  - "feature-gates=CPUManagerPolicyAlphaOptions=true"\n',
    )
    assert "mode" not in change  # an existing file keeps its mode


def test_an_entry_left_without_gates_goes_and_an_emptied_key_goes():
    text = "token: x\nkubelet-arg:\n- feature-gates=DevicePlugins=true\n# end\n"
    planned = run_plan((1, 30), {CONFIG: text})
    assert planned.files[0]["content"] == "token: x\n# end\n"
    text = "kubelet-arg:\n  - max-pods=100\n  - feature-gates=DevicePlugins=true,Accelerators=true\n"
    assert run_plan((1, 28), {CONFIG: text}).files[0]["content"] == "kubelet-arg:\n  - max-pods=100\n"


def test_a_drop_in_with_the_gate_is_edited_and_config_yaml_is_left_alone():
    texts = {
        CONFIG: UPGRADED.replace(",CPUManagerPolicyAlphaOptions=true", "").replace(
            '  - "feature-gates=DevicePlugins=true"  # by hand\n', ""
        ),
        DROPIN: "kubelet-arg+:\n  - feature-gates=DevicePlugins=true\n",
        LATER: "node-label+: [rack=a]\n",
    }
    planned = run_plan((1, 31), texts, files=[CONFIG, DROPIN, LATER])
    assert [change["path"] for change in planned.files] == [DROPIN]
    assert planned.files[0]["content"] == ""
    assert planned.after == {}


def test_an_emptied_plain_list_that_hides_an_earlier_one_stays_as_an_empty_list():
    texts = {CONFIG: "kubelet-arg: [max-pods=300]\n", DROPIN: "kubelet-arg:\n  - feature-gates=DevicePlugins=true\n"}
    planned = run_plan((1, 30), texts, files=[CONFIG, DROPIN])
    assert planned.files == [{"path": DROPIN, "content": "kubelet-arg: []\n"}]
    assert ke.merged_args([(p, yaml.safe_load(t)) for p, t in apply(texts, planned).items()]) == []


def test_flow_style_list_is_written_out_whole_with_a_warning():
    planned = run_plan((1, 30), {CONFIG: "kubelet-arg: [max-pods=1, 'feature-gates=DevicePlugins=true']\n"})
    assert yaml.safe_load(planned.files[0]["content"]) == {"kubelet-arg": ["max-pods=1"]}
    assert any("written out again whole" in warning for warning in planned.warnings)


def test_1_28_cdi_gate_is_appended_where_the_list_is_and_created_when_there_is_none():
    planned = run_plan((1, 28), {CONFIG: UPGRADED}, managed={"DevicePluginCDIDevices": True, "DevicePlugins": True})
    doc = yaml.safe_load(planned.files[0]["content"])
    assert ke.args_gates(doc["kubelet-arg"]) == {"CPUManagerPolicyAlphaOptions": True, "DevicePluginCDIDevices": True}
    assert planned.files[0]["content"].startswith("# k3s server on the GPU node")
    planned = run_plan((1, 28), {CONFIG: None}, managed={"DevicePluginCDIDevices": True})
    assert planned.files == [
        {"path": CONFIG, "content": 'kubelet-arg:\n  - "feature-gates=DevicePluginCDIDevices=true"\n', "mode": "0600"}
    ]


def test_the_gate_goes_into_the_last_file_with_a_list():
    texts = {CONFIG: "token: x\n", DROPIN: "kubelet-arg+:\n  - max-pods=300\n"}
    planned = run_plan((1, 28), texts, files=[CONFIG, DROPIN], managed={"DevicePluginCDIDevices": True})
    assert planned.files == [
        {
            "path": DROPIN,
            "content": 'kubelet-arg+:\n  - max-pods=300\n  - "feature-gates=DevicePluginCDIDevices=true"\n',
        }
    ]


def test_a_second_plan_over_the_planned_files_is_empty():
    texts = {CONFIG: UPGRADED, DROPIN: "kubelet-arg+: ['feature-gates=Accelerators=true']\n"}
    first = run_plan((1, 28), texts, files=[CONFIG, DROPIN], managed={"DevicePluginCDIDevices": True})
    second = run_plan((1, 28), apply(texts, first), files=[CONFIG, DROPIN], managed={"DevicePluginCDIDevices": True})
    assert first.files and second.files == []
    assert second.before == first.after


def test_kubelet_conf_d_drop_ins_are_read_and_edited_but_k3s_defaults_never():
    texts = {
        CONFIG: None,
        K3S_DEFAULTS: "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n",
        KUBELET_DROPIN: "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfeatureGates:\n"
        "  DevicePlugins: true\n",
    }
    planned = run_plan((1, 32), texts, dropins=[K3S_DEFAULTS, KUBELET_DROPIN])
    assert planned.before == {"DevicePlugins": True}
    assert planned.files == [{"path": KUBELET_DROPIN, "content": None}]
    assert planned.after == {}


def test_a_user_gate_the_embedded_kubelet_would_refuse_fails_before_any_change():
    with pytest.raises(ks.PlanError, match=r"DevicePlugins was removed in Kubernetes 1\.28"):
        run_plan((1, 30), {CONFIG: UPGRADED}, user={"DevicePlugins": True})


def test_a_value_that_is_not_a_list_of_strings_is_refused():
    with pytest.raises(ks.PlanError, match="neither a string nor a list"):
        run_plan((1, 30), {CONFIG: "kubelet-arg: {max-pods: 1}\n"})


def test_unit_overrides():
    argv = ["/usr/local/bin/k3s", "server", "-c", "/srv/k3s.yaml", "--kubelet-arg", "max-pods=3"]
    assert ke.unit_overrides(argv, {}, "k3s", CONFIG) == ("/srv/k3s.yaml", ["max-pods=3"])
    assert ke.unit_overrides(["k3s", "agent"], {"K3S_CONFIG_FILE": "/x.yaml"}, "k3s", CONFIG) == ("/x.yaml", [])
    rke2 = "/etc/rancher/rke2/config.yaml"
    assert ke.unit_overrides(["rke2", "server"], {}, "rke2", rke2) == (rke2, [])


@pytest.mark.parametrize(
    ("show", "in_use"),
    [
        ("LoadState=loaded\nUnitFileState=enabled\nActiveState=activating\n", True),  # crash-looping k3s
        ("LoadState=loaded\nUnitFileState=disabled\nActiveState=active\n", True),
        ("LoadState=loaded\nUnitFileState=disabled\nActiveState=inactive\n", False),  # installed, not used
        ("LoadState=not-found\nUnitFileState=\nActiveState=inactive\n", False),
    ],
)
def test_a_k3s_node_is_one_whose_unit_is_enabled_or_running(show, in_use):
    assert ke.unit_in_use(show) is in_use


def test_units_in_use_from_one_systemctl_show_of_several_units():
    show = (
        "Id=k3s.service\nLoadState=loaded\nUnitFileState=disabled\nActiveState=inactive\n\n"
        "Id=k3s-agent.service\nLoadState=not-found\nUnitFileState=\nActiveState=inactive\n\n"
        "Id=rke2-server.service\nLoadState=loaded\nUnitFileState=enabled\nActiveState=failed\n\n"
        "Id=rke2-agent.service\nLoadState=loaded\nUnitFileState=disabled\nActiveState=active\n"
    )
    assert ke.units_in_use(show) == ["rke2-server.service", "rke2-agent.service"]

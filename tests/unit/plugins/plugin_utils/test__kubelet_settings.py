"""The kubelet feature-gate planner: version table, unit and file parsing, the decision and the files it writes."""

from __future__ import annotations

import pytest
import yaml
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_gates as kg
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_settings as ks

TABLE = kg.build_table()

# `systemctl show kubelet --property=ExecStart,Environment,EnvironmentFiles` on a kubeadm node (systemd 252).
KUBEADM_SHOW = (
    "ExecStart={ path=/usr/bin/kubelet ; argv[]=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS "
    "$KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; "
    "code=(null) ; status=0/0 }\n"
    'Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf '
    '--kubeconfig=/etc/kubernetes/kubelet.conf" KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml\n'
    "EnvironmentFiles=/var/lib/kubelet/kubeadm-flags.env (ignore_errors=yes)\n"
    "EnvironmentFiles=/etc/default/kubelet (ignore_errors=yes)\n"
)
FLAGS_ENV = "/var/lib/kubelet/kubeadm-flags.env"
DEFAULT_ENV = "/etc/default/kubelet"
CONFIG = "/var/lib/kubelet/config.yaml"
KUBEADM_FLAGS = 'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock"\n'
KUBEADM_CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
cgroupDriver: systemd
# the gates below were added by hand
featureGates:
  DevicePlugins: true  # for the GPUs
  CPUManagerPolicyOptions: true
kind: KubeletConfiguration
"""


def run_plan(version, env=None, config=None, dropins=None, show=KUBEADM_SHOW, managed=None, user=None):
    unit = ks.parse_unit(show)
    texts = {FLAGS_ENV: KUBEADM_FLAGS, DEFAULT_ENV: None}
    texts.update(env or {})
    return ks.plan(
        version=version,
        table=TABLE,
        managed={"DevicePlugins": True} if managed is None else managed,
        user=user or {},
        unit=unit,
        env_texts=texts,
        config_text=config,
        dropin_texts=dropins or {},
        default_env_file=DEFAULT_ENV,
    )


def test_version_parsing():
    assert ks.kubelet_version("Kubernetes v1.30.2\n") == (1, 30)
    assert ks.kubelet_version("Kubernetes v1.8.15") == (1, 8)
    with pytest.raises(ks.PlanError, match="not 'Kubernetes"):
        ks.kubelet_version("bash: kubelet: command not found")


@pytest.mark.parametrize(
    ("version", "known", "default", "locked"),
    [
        ((1, 7), False, None, None),
        ((1, 8), True, False, False),
        ((1, 9), True, False, False),
        ((1, 10), True, True, False),
        ((1, 25), True, True, False),
        ((1, 26), True, True, True),
        ((1, 27), True, True, True),
        ((1, 28), False, None, None),
        ((1, 34), False, None, None),
    ],
)
def test_device_plugins_stages(version, known, default, locked):
    stage = kg.stage_at(TABLE, "DevicePlugins", version)
    assert (stage is not None) == known
    if stage:
        assert (stage.default, stage.locked) == (default, locked)
        assert stage.source


def test_every_table_entry_has_a_source():
    for stages in kg.TABLE.values():
        for entry in stages:
            assert entry[4]


def test_unit_parsing():
    unit = ks.parse_unit(KUBEADM_SHOW)
    assert unit.argv[0] == "/usr/bin/kubelet"
    assert unit.env_files == [FLAGS_ENV, DEFAULT_ENV]
    assert unit.environment["KUBELET_CONFIG_ARGS"] == "--config=/var/lib/kubelet/config.yaml"
    assert unit.environment["KUBELET_KUBECONFIG_ARGS"].endswith("--kubeconfig=/etc/kubernetes/kubelet.conf")


def test_1_8_with_flags_only_gets_device_plugins_in_extra_args():
    show = KUBEADM_SHOW.replace("KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml", "")
    planned = run_plan((1, 8), show=show)
    assert planned.files == [
        {"path": DEFAULT_ENV, "content": 'KUBELET_EXTRA_ARGS="--feature-gates=DevicePlugins=true"\n'}
    ]
    assert planned.before == {} and planned.after == {"DevicePlugins": True}


def test_1_9_with_config_file_gets_it_in_the_file_and_keeps_every_other_byte():
    config = "kind: KubeletConfiguration\n# keep me\ncgroupDriver: systemd\n"
    planned = run_plan((1, 9), config=config)
    assert planned.files == [{"path": CONFIG, "content": config + "featureGates:\n  DevicePlugins: true\n"}]


def test_1_10_leaves_a_node_without_the_gate_alone():
    planned = run_plan((1, 10), config="kind: KubeletConfiguration\n")
    assert planned.files == [] and planned.after == {}


def test_1_30_takes_the_removed_gate_out_of_file_and_flag():
    env = {
        DEFAULT_ENV: "# local\nKUBELET_EXTRA_ARGS=--node-labels=gpu=true"
        " --feature-gates=DevicePlugins=true,Accelerators=true\n"
    }
    planned = run_plan((1, 30), env=env, config=KUBEADM_CONFIG)
    by_path = {f["path"]: f["content"] for f in planned.files}
    assert by_path[DEFAULT_ENV] == "# local\nKUBELET_EXTRA_ARGS=--node-labels=gpu=true\n"
    assert by_path[CONFIG] == KUBEADM_CONFIG.replace("  DevicePlugins: true  # for the GPUs\n", "")
    assert planned.after == {"CPUManagerPolicyOptions": True}
    assert set(planned.removed) == {"DevicePlugins", "Accelerators"}
    assert "DevicePlugins" in planned.warnings[0] and "Accelerators" in planned.warnings[0]
    assert "117656" in planned.removed["DevicePlugins"]


def test_a_feature_gates_block_left_empty_goes():
    config = "kind: KubeletConfiguration\nfeatureGates:\n  DevicePlugins: true\nserverTLSBootstrap: true\n"
    planned = run_plan((1, 28), config=config)
    assert planned.files[0]["content"] == "kind: KubeletConfiguration\nserverTLSBootstrap: true\n"


def test_flow_style_gates_are_rewritten_whole_with_a_warning():
    config = "kind: KubeletConfiguration\nfeatureGates: {DevicePlugins: true, Foo: false}\n"
    planned = run_plan((1, 28), config=config)
    assert yaml.safe_load(planned.files[0]["content"]) == {
        "kind": "KubeletConfiguration",
        "featureGates": {"Foo": False},
    }
    assert any("written out again whole" in w for w in planned.warnings)


def test_1_26_redundant_locked_gate_is_cleaned_before_an_upgrade_breaks_it():
    planned = run_plan((1, 26), config="featureGates:\n  DevicePlugins: true\n")
    assert planned.files[0]["content"] == ""
    assert "locked" in planned.removed["DevicePlugins"]


def test_the_same_gate_in_a_separate_flag_argument_is_edited_too():
    env = {FLAGS_ENV: 'KUBELET_KUBEADM_ARGS="--feature-gates DevicePlugins=true,Foo=true --v=2"\n'}
    planned = run_plan((1, 29), env=env, config="kind: KubeletConfiguration\n")
    assert planned.files == [{"path": FLAGS_ENV, "content": 'KUBELET_KUBEADM_ARGS="--feature-gates Foo=true --v=2"\n'}]


def test_1_8_existing_false_flag_is_turned_true_where_it_is():
    env = {FLAGS_ENV: 'KUBELET_KUBEADM_ARGS="--feature-gates=DevicePlugins=false"\n'}
    show = KUBEADM_SHOW.replace("KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml", "")
    planned = run_plan((1, 8), env=env, show=show)
    assert planned.files == [
        {"path": FLAGS_ENV, "content": 'KUBELET_KUBEADM_ARGS="--feature-gates=DevicePlugins=true"\n'}
    ]


def test_file_and_flag_both_carry_it_on_1_9_and_both_agree_after():
    env = {DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--feature-gates=DevicePlugins=false\n"}
    planned = run_plan((1, 9), env=env, config="featureGates:\n  DevicePlugins: false\n")
    by_path = {f["path"]: f["content"] for f in planned.files}
    assert by_path == {
        CONFIG: "featureGates:\n  DevicePlugins: true\n",
        DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--feature-gates=DevicePlugins=true\n",
    }


def test_dropins_are_read_and_edited():
    show = KUBEADM_SHOW.replace(
        "KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml",
        '"KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml --config-dir=/etc/kubernetes/kubelet.conf.d"',
    )
    dropins = {
        "/etc/kubernetes/kubelet.conf.d/50-gpu.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\nfeatureGates:\n  DevicePlugins: true\n",
        "/etc/kubernetes/kubelet.conf.d/60-other.conf": "featureGates:\n  DevicePlugins: true\nmaxPods: 50\n",
    }
    planned = run_plan((1, 30), show=show, config="kind: KubeletConfiguration\n", dropins=dropins)
    assert planned.files[1] == {"path": "/etc/kubernetes/kubelet.conf.d/60-other.conf", "content": "maxPods: 50\n"}
    assert planned.files[:1] == [{"path": "/etc/kubernetes/kubelet.conf.d/50-gpu.conf", "content": None}]
    assert planned.before == {"DevicePlugins": True} and planned.after == {}


def test_second_plan_over_the_planned_files_is_empty():
    env = {DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--feature-gates=DevicePlugins=true\n"}
    first = run_plan((1, 30), env=env, config=KUBEADM_CONFIG)
    texts = {f["path"]: f["content"] for f in first.files}
    second = run_plan((1, 30), env={DEFAULT_ENV: texts[DEFAULT_ENV]}, config=texts[CONFIG])
    assert second.files == [] and second.removed == {}


@pytest.mark.parametrize(
    ("version", "gates", "message"),
    [
        ((1, 30), {"DevicePlugins": True}, "DevicePlugins was removed in Kubernetes 1.28"),
        ((1, 30), {"NoSuchGate": True}, "NoSuchGate is not in the gate table"),
        ((1, 26), {"DevicePlugins": False}, "DevicePlugins is locked to true in kubelet 1.26"),
        ((1, 27), {"DevicePluginCDIDevices": True}, "does not exist yet in kubelet 1.27"),
    ],
)
def test_user_gates_the_kubelet_would_refuse_fail_before_any_change(version, gates, message):
    with pytest.raises(ks.PlanError, match=message):
        run_plan(version, config="kind: KubeletConfiguration\n", user=gates)


def test_user_gate_from_an_extended_table_is_written():
    table = kg.build_table({"KubeletTracing": [{"since": "1.25", "stage": "alpha", "default": False, "source": "x"}]})
    planned = ks.plan(
        version=(1, 30),
        table=table,
        managed={},
        user={"KubeletTracing": True},
        unit=ks.parse_unit(KUBEADM_SHOW),
        env_texts={FLAGS_ENV: KUBEADM_FLAGS},
        config_text="kind: KubeletConfiguration\n",
        dropin_texts={},
        default_env_file=DEFAULT_ENV,
    )
    assert planned.files[0]["content"].endswith("featureGates:\n  KubeletTracing: true\n")


def test_cdi_gate_only_on_1_28():
    assert run_plan((1, 28), config="", managed={"DevicePluginCDIDevices": True}).after == {
        "DevicePluginCDIDevices": True
    }
    assert run_plan((1, 29), config="", managed={"DevicePluginCDIDevices": True}).files == []


def test_malformed_table_entry_is_refused():
    with pytest.raises(kg.GateTableError, match="stage 'gone'"):
        kg.build_table({"X": [{"since": "1.2", "stage": "gone"}]})


def test_invalid_gate_value_in_a_flag():
    env = {DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--feature-gates=DevicePlugins=maybe\n"}
    with pytest.raises(ks.PlanError, match="'maybe' is not true or false"):
        run_plan((1, 30), env=env, config="")


def test_provisioner_message_names_the_source_setting():
    planned = run_plan((1, 30), config="featureGates:\n  DevicePlugins: true\n")
    text = ks.provisioner_message("kops nodeup", "the InstanceGroup's spec.kubelet.featureGates", planned)
    assert "spec.kubelet.featureGates" in text and "take out: DevicePlugins" in text and "Nothing was changed" in text

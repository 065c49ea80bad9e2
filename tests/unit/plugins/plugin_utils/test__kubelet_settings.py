"""The kubelet feature-gate planner over the files real nodes have: the unit and its drop-ins, environment files,
the config file and its drop-ins; the decision; the files it writes (every other byte kept); the health message."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_gates as kg
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_settings as ks

TABLE = kg.build_table()

UNIT = "/lib/systemd/system/kubelet.service"
DROPIN = "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"
FLAGS_ENV = "/var/lib/kubelet/kubeadm-flags.env"
DEFAULT_ENV = "/etc/default/kubelet"
CONFIG = "/var/lib/kubelet/config.yaml"

STANDIN = Path(__file__).resolve().parents[3] / "kubelet_standin"
# The kubelet package's unit (kubernetes/release, kubelet.service) and kubeadm's drop-in since 1.11 as the molecule
# scenario installs it (tests/kubelet_standin/10-kubeadm.conf): flags from kubeadm-flags.env and KUBELET_EXTRA_ARGS,
# the config file.
PACKAGE_UNIT = """[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""
KUBEADM_DROPIN = (STANDIN / "10-kubeadm.conf").read_text()
# The drop-in kubeadm's 1.8 and 1.9 packages installed (after kubernetes/release, debian/xenial/kubeadm/channel/stable/
# etc/systemd/system/kubelet.service.d/10-kubeadm.conf of that time): every flag in Environment= lines, no config file,
# no environment file; the user's line added as kubeadm's docs of the time said (seed 002's instructions). The same
# file is the molecule scenario's 1.8 and 1.25 drop-in.
KUBEADM_18_DROPIN = (STANDIN / "10-kubeadm-1.8.conf").read_text()
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


def show(files=(UNIT, DROPIN), env_files=((FLAGS_ENV, True), (DEFAULT_ENV, True)), version=252, reload=False):
    """What `systemctl show kubelet.service --property=...; systemctl --version` prints (systemd 252)."""
    lines = [
        "Id=kubelet.service",
        "LoadState=loaded",
        f"FragmentPath={files[0]}",
        f"DropInPaths={' '.join(files[1:])}",
        *[f"EnvironmentFiles={p} (ignore_errors={'yes' if o else 'no'})" for p, o in env_files],
        f"NeedDaemonReload={'yes' if reload else 'no'}",
        f"systemd {version} ({version}.33-1~deb12u1)",
        "+PAM +AUDIT +SELINUX +APPARMOR +IMA +SMACK +SECCOMP",
    ]
    return ks.parse_show("\n".join(lines) + "\n", "kubelet.service")


def run_plan(
    version,
    env=None,
    config=None,
    dropins=None,
    unit=None,
    units=None,
    managed=None,
    user=None,
    override="",
):
    texts = {UNIT: PACKAGE_UNIT, DROPIN: KUBEADM_DROPIN, FLAGS_ENV: KUBEADM_FLAGS, DEFAULT_ENV: None}
    texts.update(units or {})
    texts.update(env or {})
    return ks.plan(
        version=version,
        table=TABLE,
        managed={"DevicePlugins": True} if managed is None else managed,
        user=user or {},
        unit=unit or show(),
        texts=texts,
        config_text=config,
        dropin_texts=dropins or {},
        default_env_file=DEFAULT_ENV,
        healthz_override=override,
    )


def by_path(planned):
    return {f["path"]: f["content"] for f in planned.files}


def replan(first, version, env=None, config=None, **kwargs):
    """Plan again over the files the first plan wrote (it must find nothing left to do)."""
    written = by_path(first)
    texts = {UNIT: PACKAGE_UNIT, DROPIN: KUBEADM_DROPIN, FLAGS_ENV: KUBEADM_FLAGS, DEFAULT_ENV: None}
    texts.update(kwargs.pop("units", None) or {})
    texts.update(env or {})
    texts.update({p: t for p, t in written.items() if p != CONFIG})
    return run_plan(version, env=texts, config=written.get(CONFIG, config), **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# Versions and the gate table
# ---------------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------------
# Reading the unit as systemd does
# ---------------------------------------------------------------------------------------------------------------------


def test_show_parsing():
    unit = show(reload=True)
    assert unit.files == [UNIT, DROPIN]
    assert unit.env_files == [(FLAGS_ENV, True), (DEFAULT_ENV, True)]
    assert (unit.need_reload, unit.systemd_version, unit.load_state) == (True, 252, "loaded")


def test_the_kubelet_command_line_as_systemd_builds_it():
    env = {DEFAULT_ENV: "KUBELET_EXTRA_ARGS='--node-labels=gpu=true,zone=a b' --v=2\n"}
    planned = run_plan((1, 30), env=env, config="kind: KubeletConfiguration\n")
    assert planned.argv == [
        "/usr/bin/kubelet",
        "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
        "--kubeconfig=/etc/kubernetes/kubelet.conf",
        "--config=/var/lib/kubelet/config.yaml",
        "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
        "--node-labels=gpu=true,zone=a",
        "b--v=2",  # systemd skips the whitespace after a closing quote in an environment file
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Layouts of kubeadm 1.10+ (environment files, config file, drop-ins)
# ---------------------------------------------------------------------------------------------------------------------


def test_1_8_with_flags_only_gets_device_plugins_in_extra_args():
    units = {DROPIN: KUBEADM_DROPIN.replace("--config=/var/lib/kubelet/config.yaml", "")}
    planned = run_plan((1, 8), units=units)
    assert planned.files == [
        {"path": DEFAULT_ENV, "content": 'KUBELET_EXTRA_ARGS="--feature-gates=DevicePlugins=true"\n'}
    ]
    assert planned.before == {} and planned.after == {"DevicePlugins": True}
    assert not planned.daemon_reload
    assert replan(planned, (1, 8), units=units).files == []


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
    assert by_path(planned) == {
        CONFIG: KUBEADM_CONFIG.replace("  DevicePlugins: true  # for the GPUs\n", ""),
        DEFAULT_ENV: "# local\nKUBELET_EXTRA_ARGS=--node-labels=gpu=true\n",
    }
    assert planned.after == {"CPUManagerPolicyOptions": True}
    assert set(planned.removed) == {"DevicePlugins", "Accelerators"}
    assert "DevicePlugins" in planned.warnings[0] and "Accelerators" in planned.warnings[0]
    assert f"--feature-gates in $KUBELET_EXTRA_ARGS (environment file {DEFAULT_ENV})" in planned.warnings[0]
    assert "117656" in planned.removed["DevicePlugins"]
    assert replan(planned, (1, 30), env=env).files == []


def test_a_continued_line_in_an_environment_file_is_read_and_edited():
    """Issue 21: a value continued with a trailing backslash carried the removed gate; the role saw nothing."""
    env = {DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--node-labels=gpu=true \\\n    --feature-gates=DevicePlugins=true\n"}
    planned = run_plan((1, 30), env=env, config="kind: KubeletConfiguration\n")
    assert planned.before == {"DevicePlugins": True}
    assert by_path(planned) == {DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--node-labels=gpu=true\n"}
    assert replan(planned, (1, 30), env=env, config="kind: KubeletConfiguration\n").files == []


def test_quotes_inside_a_value_are_removed_as_systemd_removes_them():
    """Issue 21: --feature-gates="DevicePlugins=true" failed with "'true"' is not true or false"."""
    env = {FLAGS_ENV: 'KUBELET_KUBEADM_ARGS=--feature-gates="DevicePlugins=true" --v=2\n'}
    planned = run_plan((1, 30), env=env, config="kind: KubeletConfiguration\n")
    assert planned.before == {"DevicePlugins": True}
    assert by_path(planned) == {FLAGS_ENV: "KUBELET_KUBEADM_ARGS=--v=2\n"}


def test_a_gate_in_quotes_is_changed_where_it_is_written():
    env = {FLAGS_ENV: "KUBELET_KUBEADM_ARGS='--feature-gates=\"DevicePlugins=false,Foo=true\" --v=2'\n"}
    planned = run_plan(
        (1, 9), env=env, units={DROPIN: KUBEADM_DROPIN.replace("--config=/var/lib/kubelet/config.yaml", "")}
    )
    assert by_path(planned) == {FLAGS_ENV: "KUBELET_KUBEADM_ARGS='--feature-gates=DevicePlugins=true,Foo=true --v=2'\n"}


def test_the_last_assignment_of_a_variable_counts_and_is_the_one_edited():
    env = {
        DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--feature-gates=DevicePlugins=true\n"
        "KUBELET_EXTRA_ARGS=--v=2 --feature-gates=DevicePlugins=true,Foo=true\n"
    }
    planned = run_plan((1, 30), env=env, config="")
    assert by_path(planned) == {
        DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--feature-gates=DevicePlugins=true\n"
        "KUBELET_EXTRA_ARGS=--v=2 --feature-gates=Foo=true\n"
    }


def test_a_missing_optional_environment_file_is_no_error_and_gets_created_for_a_new_gate():
    units = {DROPIN: KUBEADM_DROPIN.replace("--config=/var/lib/kubelet/config.yaml", "")}
    planned = run_plan((1, 9), units=units, env={FLAGS_ENV: None})
    assert by_path(planned) == {DEFAULT_ENV: 'KUBELET_EXTRA_ARGS="--feature-gates=DevicePlugins=true"\n'}


def test_a_feature_gates_block_left_empty_goes():
    config = "kind: KubeletConfiguration\nfeatureGates:\n  DevicePlugins: true\nserverTLSBootstrap: true\n"
    planned = run_plan((1, 28), config=config)
    assert planned.files[0]["content"] == "kind: KubeletConfiguration\nserverTLSBootstrap: true\n"


def test_flow_style_gates_keep_the_file_s_comments():
    """Issue 17 item 7: featureGates in flow style lost every comment of the file on write."""
    config = "kind: KubeletConfiguration\n# by hand, 2017\nfeatureGates: {DevicePlugins: true, Foo: false}  # GPUs\n"
    planned = run_plan((1, 28), config=config)
    assert by_path(planned) == {CONFIG: config.replace("{DevicePlugins: true, Foo: false}", "{Foo: false}")}
    assert not any("written out again whole" in w for w in planned.warnings)


def test_a_json_config_file_is_edited_as_json():
    """Issue 21: a JSON config (EKS) got YAML appended, then was refused as invalid YAML."""
    units = {
        DROPIN: KUBEADM_DROPIN.replace("/var/lib/kubelet/config.yaml", "/etc/kubernetes/kubelet/kubelet-config.json")
    }
    json_config = '{\n  "kind": "KubeletConfiguration",\n  "cgroupDriver": "systemd"\n}\n'
    planned = ks.plan(
        version=(1, 9),
        table=TABLE,
        managed={"DevicePlugins": True},
        user={},
        unit=show(),
        texts={UNIT: PACKAGE_UNIT, FLAGS_ENV: KUBEADM_FLAGS, DEFAULT_ENV: None, **units},
        config_text=json_config,
        dropin_texts={},
        default_env_file=DEFAULT_ENV,
    )
    assert by_path(planned) == {
        "/etc/kubernetes/kubelet/kubelet-config.json": '{\n  "kind": "KubeletConfiguration",\n  "cgroupDriver": '
        '"systemd",\n  "featureGates": {\n    "DevicePlugins": true\n  }\n}\n'
    }


def test_1_26_redundant_locked_gate_is_cleaned_before_an_upgrade_breaks_it():
    planned = run_plan((1, 26), config="featureGates:\n  DevicePlugins: true\n")
    assert planned.files[0]["content"] == ""
    assert "locked" in planned.removed["DevicePlugins"]


def test_the_same_gate_in_a_separate_flag_argument_is_edited_too():
    env = {FLAGS_ENV: 'KUBELET_KUBEADM_ARGS="--feature-gates DevicePlugins=true,Foo=true --v=2"\n'}
    planned = run_plan((1, 29), env=env, config="kind: KubeletConfiguration\n")
    assert planned.files == [{"path": FLAGS_ENV, "content": 'KUBELET_KUBEADM_ARGS="--feature-gates Foo=true --v=2"\n'}]
    env = {FLAGS_ENV: 'KUBELET_KUBEADM_ARGS="--v=2 --feature-gates DevicePlugins=true"\n'}
    planned = run_plan((1, 29), env=env, config="kind: KubeletConfiguration\n")
    assert planned.files == [{"path": FLAGS_ENV, "content": 'KUBELET_KUBEADM_ARGS="--v=2"\n'}]


def test_1_8_existing_false_flag_is_turned_true_where_it_is():
    env = {FLAGS_ENV: 'KUBELET_KUBEADM_ARGS="--feature-gates=DevicePlugins=false"\n'}
    units = {DROPIN: KUBEADM_DROPIN.replace("--config=/var/lib/kubelet/config.yaml", "")}
    planned = run_plan((1, 8), env=env, units=units)
    assert planned.files == [
        {"path": FLAGS_ENV, "content": 'KUBELET_KUBEADM_ARGS="--feature-gates=DevicePlugins=true"\n'}
    ]


def test_file_and_flag_both_carry_it_on_1_9_and_both_agree_after():
    env = {DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--feature-gates=DevicePlugins=false\n"}
    planned = run_plan((1, 9), env=env, config="featureGates:\n  DevicePlugins: false\n")
    assert by_path(planned) == {
        CONFIG: "featureGates:\n  DevicePlugins: true\n",
        DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--feature-gates=DevicePlugins=true\n",
    }


def test_dropins_are_read_and_edited():
    units = {DROPIN: KUBEADM_DROPIN.replace('.yaml"', '.yaml --config-dir=/etc/kubernetes/kubelet.conf.d"')}
    dropins = {
        "/etc/kubernetes/kubelet.conf.d/50-gpu.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\nfeatureGates:\n  DevicePlugins: true\n",
        "/etc/kubernetes/kubelet.conf.d/60-other.conf": "featureGates:\n  DevicePlugins: true\nmaxPods: 50\n",
    }
    planned = run_plan((1, 30), units=units, config="kind: KubeletConfiguration\n", dropins=dropins)
    assert planned.files[1] == {"path": "/etc/kubernetes/kubelet.conf.d/60-other.conf", "content": "maxPods: 50\n"}
    assert planned.files[:1] == [{"path": "/etc/kubernetes/kubelet.conf.d/50-gpu.conf", "content": None}]
    assert planned.before == {"DevicePlugins": True} and planned.after == {}


# ---------------------------------------------------------------------------------------------------------------------
# Flags written in the unit itself (kubeadm 1.8/1.9, hand-written units)
# ---------------------------------------------------------------------------------------------------------------------


def stock_18(extra_line='Environment="KUBELET_EXTRA_ARGS=--feature-gates=Accelerators=true"\n'):
    text = KUBEADM_18_DROPIN.replace('Environment="KUBELET_EXTRA_ARGS=--feature-gates=Accelerators=true"\n', extra_line)
    return {DROPIN: text}


def plan_18(version, units):
    return run_plan(version, units=units, unit=show(env_files=()))


def test_1_8_stock_drop_in_gets_the_gate_inside_its_environment_value():
    """Issue 17 item 7: the 1.8/1.9 drop-in carries the flags in Environment= lines; the role refused."""
    units = stock_18()
    planned = plan_18((1, 8), units)
    assert planned.before == {"Accelerators": True}
    assert by_path(planned) == {
        DROPIN: units[DROPIN].replace(
            "--feature-gates=Accelerators=true", "--feature-gates=Accelerators=true,DevicePlugins=true"
        )
    }
    assert planned.daemon_reload
    assert planned.after == {"Accelerators": True, "DevicePlugins": True}
    assert plan_18((1, 8), by_path(planned)).files == []


def test_1_8_stock_drop_in_without_extra_args_gets_an_environment_line_before_exec_start():
    units = stock_18(extra_line="")
    planned = plan_18((1, 9), units)
    new = by_path(planned)[DROPIN]
    assert new == units[DROPIN].replace(
        "ExecStart=\n", 'Environment="KUBELET_EXTRA_ARGS=--feature-gates=DevicePlugins=true"\nExecStart=\n'
    )
    assert plan_18((1, 9), {DROPIN: new}).files == []


def test_a_node_upgraded_to_1_25_with_the_stock_drop_in_loses_the_removed_gate():
    """Issue 17 item 7: kubelet 1.25 down on Accelerators=true in 10-kubeadm.conf; the message named nothing."""
    units = stock_18()
    planned = plan_18((1, 25), units)
    assert by_path(planned) == {
        DROPIN: units[DROPIN].replace('"KUBELET_EXTRA_ARGS=--feature-gates=Accelerators=true"', '"KUBELET_EXTRA_ARGS="')
    }
    assert "Accelerators (removed in Kubernetes 1.11" in planned.warnings[0]
    assert f"$KUBELET_EXTRA_ARGS (Environment= {DROPIN})" in planned.warnings[0]
    assert planned.daemon_reload


def test_an_unquoted_environment_word_is_quoted_when_a_flag_is_added():
    units = stock_18(extra_line="Environment=KUBELET_EXTRA_ARGS=--v=2\n")
    planned = plan_18((1, 8), units)
    assert by_path(planned)[DROPIN] == units[DROPIN].replace(
        "Environment=KUBELET_EXTRA_ARGS=--v=2",
        'Environment="KUBELET_EXTRA_ARGS=--v=2 --feature-gates=DevicePlugins=true"',
    )


def test_a_gate_written_in_exec_start_itself_is_edited_there_continuations_kept():
    unit_text = (
        "[Service]\nExecStart=/usr/local/bin/kubelet \\\n  --config=/etc/kubelet.yaml \\\n"
        "  --feature-gates=DevicePlugins=true \\\n  --v=2\nRestart=always\n"
    )
    unit = show(files=("/etc/systemd/system/kubelet.service",), env_files=())
    planned = ks.plan(
        version=(1, 30),
        table=TABLE,
        managed={"DevicePlugins": True},
        user={},
        unit=unit,
        texts={"/etc/systemd/system/kubelet.service": unit_text},
        config_text="kind: KubeletConfiguration\n",
        dropin_texts={},
        default_env_file=DEFAULT_ENV,
    )
    assert by_path(planned) == {
        "/etc/systemd/system/kubelet.service": unit_text.replace("  --feature-gates=DevicePlugins=true \\\n", "")
    }
    assert planned.daemon_reload


def test_a_unit_changed_on_disk_is_reloaded_before_the_restart():
    planned = run_plan((1, 30), config="featureGates:\n  DevicePlugins: true\n", unit=show(reload=True))
    assert planned.daemon_reload and any("changed on disk" in w for w in planned.warnings)


def test_nowhere_to_add_a_flag_names_the_unit_files_and_the_gate():
    planned_unit = show(files=(UNIT,), env_files=())
    with pytest.raises(ks.PlanError, match=rf"nowhere to add --feature-gates=DevicePlugins=true .*read: {UNIT}"):
        run_plan((1, 8), unit=planned_unit)


# ---------------------------------------------------------------------------------------------------------------------
# Refusals name the file and the gate
# ---------------------------------------------------------------------------------------------------------------------


def test_invalid_gate_value_in_a_flag_names_the_file_and_the_gate():
    env = {DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--feature-gates=DevicePlugins=maybe\n"}
    with pytest.raises(ks.PlanError) as raised:
        run_plan((1, 30), env=env, config="")
    assert str(raised.value) == (
        f"--feature-gates in $KUBELET_EXTRA_ARGS (environment file {DEFAULT_ENV}): DevicePlugins=maybe: 'maybe' is not "
        "true or false (the kubelet refuses it too)"
    )


def test_invalid_gate_value_in_a_config_file_names_the_file_and_the_gate():
    with pytest.raises(ks.PlanError, match=rf"{CONFIG}: featureGates.DevicePlugins is 'yes please'"):
        run_plan((1, 30), config="featureGates:\n  DevicePlugins: yes please\n")


@pytest.mark.parametrize(
    ("version", "gates", "message"),
    [
        ((1, 30), {"DevicePlugins": True}, "DevicePlugins was removed in Kubernetes 1.28"),
        ((1, 30), {"NoSuchGate": True}, "NoSuchGate is not in the gate table"),
        ((1, 26), {"DevicePlugins": False}, "DevicePlugins is locked to true in kubelet 1.26"),
        ((1, 27), {"DevicePluginCDIDevices": True}, "does not exist yet in kubelet 1.27"),
        ((1, 27), {"Bad,Name": True}, "'Bad,Name' is not a feature gate name"),
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
        unit=show(),
        texts={UNIT: PACKAGE_UNIT, DROPIN: KUBEADM_DROPIN, FLAGS_ENV: KUBEADM_FLAGS},
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


def test_provisioner_message_names_the_source_setting():
    planned = run_plan((1, 30), config="featureGates:\n  DevicePlugins: true\n")
    text = ks.provisioner_message("kops nodeup", "the InstanceGroup's spec.kubelet.featureGates", planned)
    assert "spec.kubelet.featureGates" in text and "take out: DevicePlugins" in text and "Nothing was changed" in text


# ---------------------------------------------------------------------------------------------------------------------
# The health endpoint and the kubelet's health
# ---------------------------------------------------------------------------------------------------------------------


def test_health_endpoint_read_from_the_config_file_and_overridden_by_a_flag():
    """Issue 21: a config with healthzPort made the role poll 10248, roll back a correct fix and leave it down."""
    config = "kind: KubeletConfiguration\nhealthzPort: 10255\nhealthzBindAddress: 127.0.0.1\n"
    assert run_plan((1, 30), config=config).healthz_url == "http://127.0.0.1:10255/healthz"
    env = {DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--healthz-port=10266\n"}
    assert run_plan((1, 30), config=config, env=env).healthz_url == "http://127.0.0.1:10266/healthz"
    assert run_plan((1, 30), config=config, override="http://10.0.0.1:1/x").healthz_url == "http://10.0.0.1:1/x"
    assert run_plan((1, 30), config="healthzPort: 0\n").healthz_url is None


@pytest.mark.parametrize(
    ("state", "down"),
    [
        ({"ActiveState": "activating", "SubState": "auto-restart"}, True),
        ({"ActiveState": "failed", "SubState": "failed"}, True),
        ({"ActiveState": "inactive", "SubState": "dead"}, True),
        ({"ActiveState": "active", "SubState": "running"}, False),
        ({"ActiveState": "activating", "SubState": "start"}, False),
    ],
)
def test_down_or_still_starting(state, down):
    assert ks.is_down(state) is down


def test_unhealthy_message_names_the_gate_and_the_file():
    env = {DEFAULT_ENV: "KUBELET_EXTRA_ARGS=--feature-gates=MadeUpGate=true\n"}
    planned = run_plan((1, 30), env=env, config="kind: KubeletConfiguration\n")
    assert planned.files == []
    state = {"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "7", "Result": "exit-code"}
    error = (
        'E1122 10:00:00.000000 1234 server.go:1] "command failed" err="failed to set feature gates from initial '
        'flags-based config: unrecognized feature gate: MadeUpGate"'
    )
    message = ks.unhealthy_message("kubelet.service", planned.healthz_url, "Connection refused", state, error, planned)
    assert message.startswith(
        "kubelet.service does not answer http://127.0.0.1:10248/healthz (Connection refused); systemd says it is "
        "activating (auto-restart), restarted 7 times, result exit-code. Its last error: E1122"
    )
    assert f"MadeUpGate is set in --feature-gates in $KUBELET_EXTRA_ARGS (environment file {DEFAULT_ENV})." in message
    assert "kubelet_feature_gate_table" in message and "the cause is elsewhere" in message

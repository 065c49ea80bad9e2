"""kubelet_feature_gates against a node made of a folder: a kubeadm kubelet (unit, kubeadm drop-in, flags file, config
file and --config-dir drop-ins), systemctl and the kubelet binary stood in for by scripts on the PATH, everything else
the real shell and coreutils. The plan reads the node in few round trips (issue 18: a no-op site.yml takes at most 60
SSH round trips per host; this action took 10, twice a run): each read here is one command or one module."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ansible_collections.kubegpu.node.plugins.action.kubelet_feature_gates import ActionModule

SYSTEMCTL = r"""#!/bin/sh
# systemctl show UNIT... --property=...; systemctl --version
root=$(dirname "$(dirname "$0")")
case "$1" in
--version) echo "systemd 252 (252.30-1~deb12u2)"; echo "+PAM +AUDIT" ;;
show)
  shift
  for a; do
    case "$a" in
    --property=*) ;;
    kubelet.service)
      echo "Id=kubelet.service"; echo "LoadState=loaded"; echo "FragmentPath=$root/lib/kubelet.service"
      echo "DropInPaths=$root/etc/10-kubeadm.conf"
      echo "EnvironmentFiles=$root/var/kubeadm-flags.env (ignore_errors=yes)"
      echo "EnvironmentFiles=$root/etc/default-kubelet (ignore_errors=yes)"
      echo "NeedDaemonReload=no"; echo ;;
    *) echo "Id=$a"; echo "LoadState=not-found"; echo "UnitFileState="; echo "ActiveState=inactive"; echo ;;
    esac
  done ;;
*) echo "systemctl stand-in: $*" >&2; exit 1 ;;
esac
"""


def node(tmp_path: Path, dropins: dict[str, str]) -> Path:
    root = tmp_path / "node"
    for folder in ("bin", "lib", "etc", "var", "conf.d"):
        (root / folder).mkdir(parents=True)
    (root / "bin" / "systemctl").write_text(SYSTEMCTL)
    (root / "bin" / "kubelet").write_text('#!/bin/sh\necho "Kubernetes v1.30.4"\n')
    for name in ("systemctl", "kubelet"):
        (root / "bin" / name).chmod(0o755)
    (root / "lib" / "kubelet.service").write_text("[Service]\nExecStart=/usr/bin/kubelet\nRestart=always\n")
    (root / "etc" / "10-kubeadm.conf").write_text(
        "[Service]\n"
        'Environment="KUBELET_KUBECONFIG_ARGS=--kubeconfig=/etc/kubernetes/kubelet.conf"\n'
        f'Environment="KUBELET_CONFIG_ARGS=--config={root}/var/config.yaml --config-dir={root}/conf.d"\n'
        f"EnvironmentFile=-{root}/var/kubeadm-flags.env\n"
        f"EnvironmentFile=-{root}/etc/default-kubelet\n"
        "ExecStart=\n"
        "ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS "
        "$KUBELET_EXTRA_ARGS\n"
    )
    (root / "var" / "kubeadm-flags.env").write_text('KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///x"\n')
    (root / "var" / "config.yaml").write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: 10248\n"
    )
    for name, text in dropins.items():
        (root / "conf.d" / name).write_text(text)
    (root / "conf.d" / ".hidden.conf").write_text("not read: the kubelet's --config-dir skips hidden files\n")
    return root


def action(root: Path, trips: list[str]) -> ActionModule:
    act = ActionModule.__new__(ActionModule)
    act._task = SimpleNamespace(check_mode=False)
    act._vars = {"inventory_hostname": "gpu-a"}
    env = {**os.environ, "PATH": f"{root / 'bin'}:{os.environ['PATH']}"}

    def execute(cmd: str) -> dict[str, Any]:
        trips.append(cmd[:60])
        done = subprocess.run(cmd, shell=True, capture_output=True, text=True, check=False, env=env)
        return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    def module(module_name: str, module_args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        trips.append(module_name)
        assert module_name == "ansible.legacy.uri", module_name
        assert module_args["url"] == "http://127.0.0.1:10248/healthz"
        return {"status": 200}

    act._low_level_execute_command = execute  # type: ignore[method-assign]
    act._execute_module = module  # type: ignore[method-assign]
    return act


ARGS: dict[str, Any] = {
    "device_plugins": False,
    "cdi_devices": False,
    "feature_gates": {},
    "gate_table": {},
    "service": "kubelet.service",
    "binary": "kubelet",
    "default_env_file": "/nonexistent/default/kubelet",
    "provisioners": [{"name": "kops", "marker": "/nonexistent/kops", "setting": "spec.kubelet"}],
    "allow_provisioned_edit": False,
    "healthz_url": "",
    "check_health": True,
    "embedded": [
        {"name": "k3s", "units": ["k3s.service", "k3s-agent.service"], "binary": "k3s", "config_file": "/x/k3s.yaml"}
    ],
}


@pytest.mark.parametrize(
    ("dropins", "most"),
    [({}, 4), ({"20-gpu.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"}, 5)],
    ids=["no drop-ins", "a drop-in"],
)
def test_a_noop_plan_reads_the_node_in_few_round_trips(tmp_path, dropins, most):
    root = node(tmp_path, dropins)
    trips: list[str] = []
    out = action(root, trips)._run(dict(ARGS))
    assert out["files"] == [] and out["provisioner"] is None and out["version"] == "1.30", out
    assert out["config_file"] == f"{root}/var/config.yaml"
    assert out["health"] == {"ok": True, "url": "http://127.0.0.1:10248/healthz"}
    # One command for the versions, systemd's word on each unit and the markers; one for the unit's files; one for
    # the config file with the drop-in folder's listing; the drop-ins themselves when there are any; the health GET.
    assert len(trips) == most, trips


def test_the_drop_ins_read_are_the_visible_conf_files_in_order(tmp_path):
    root = node(
        tmp_path,
        {
            "50-b.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
            "10-a.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
            "notes.txt": "not a drop-in\n",
        },
    )
    trips: list[str] = []
    act = action(root, trips)
    texts, lists = act._reads([f"{root}/var/config.yaml", f"{root}/missing"], [f"{root}/conf.d/*.conf", "/nope/*.x"])
    assert lists == [[f"{root}/conf.d/10-a.conf", f"{root}/conf.d/50-b.conf"], []]
    assert texts[f"{root}/missing"] is None and "healthzPort" in (texts[f"{root}/var/config.yaml"] or "")
    assert len(trips) == 1

"""Debian's kubectl (a real client nobody here wrote) against the simulator: the fidelity check."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubesim import SimCluster
from sim_objects import DAEMONSET


def _run(kubectl: str, kubeconfig: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=60, check=False
    )
    if check and result.returncode != 0:
        pytest.fail(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def manifest(tmp_path: Path) -> str:
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump(DAEMONSET))
    return str(path)


def test_get_nodes_as_json(kubectl: str, kubeconfig: str) -> None:
    nodes = json.loads(_run(kubectl, kubeconfig, "get", "nodes", "-o", "json").stdout)
    assert sorted(n["metadata"]["name"] for n in nodes["items"]) == ["cpu-1", "gpu-1", "gpu-2"]
    table = _run(kubectl, kubeconfig, "get", "nodes").stdout.splitlines()
    assert table[0].split()[:2] == ["NAME", "STATUS"] and "Ready" in table[1]


@pytest.mark.parametrize("validate", ["--validate=false", "--validate=strict"])
def test_apply_server_side_wait_and_delete(
    cluster: SimCluster, kubectl: str, kubeconfig: str, manifest: str, validate: str
) -> None:
    applied = _run(kubectl, kubeconfig, "apply", "--server-side", validate, "-f", manifest)
    assert applied.stdout.strip() == "daemonset.apps/nvidia-device-plugin-daemonset serverside-applied"
    waited = _run(
        kubectl,
        kubeconfig,
        "wait",
        "--for=jsonpath={.status.capacity.nvidia\\.com/gpu}=8",
        "node/gpu-1",
        "--timeout=20s",
    )
    assert "condition met" in waited.stdout

    cluster.settle()
    before: dict[str, Any] = cluster.get_object("daemonset", "nvidia-device-plugin-daemonset", "kube-system") or {}
    _run(kubectl, kubeconfig, "apply", "--server-side", validate, "-f", manifest)
    after: dict[str, Any] = cluster.get_object("daemonset", "nvidia-device-plugin-daemonset", "kube-system") or {}
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert {m["manager"] for m in after["metadata"]["managedFields"]} >= {"kubectl"}

    logs = _run(kubectl, kubeconfig, "logs", "-n", "kube-system", "-l", "name=nvidia-device-plugin-ds", "--tail=1")
    assert "Registered device plugin" in logs.stdout or "No devices found" in logs.stdout

    deleted = _run(kubectl, kubeconfig, "delete", "-f", manifest, "--timeout=20s")
    assert "deleted" in deleted.stdout
    assert cluster.wait_for(lambda: not cluster.list_objects("pods", "kube-system"))


def test_kubectl_sees_a_conflict(kubectl: str, kubeconfig: str, manifest: str, tmp_path: Path) -> None:
    _run(kubectl, kubeconfig, "apply", "--server-side", "-f", manifest)
    changed = yaml.safe_load(Path(manifest).read_text())
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.local/plugin:v1"
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(changed))
    refused = _run(
        kubectl, kubeconfig, "apply", "--server-side", "--field-manager=other", "-f", str(other), check=False
    )
    assert refused.returncode != 0 and "conflict" in refused.stderr.lower()
    forced = _run(
        kubectl, kubeconfig, "apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", str(other)
    )
    assert "serverside-applied" in forced.stdout


def test_wrong_token_is_refused(cluster: SimCluster, kubectl: str, tmp_path: Path) -> None:
    config = cluster.kubeconfig_dict()
    config["users"][0]["user"]["token"] = "wrong"
    path = tmp_path / "wrong"
    path.write_text(yaml.safe_dump(config))
    result = _run(kubectl, str(path), "get", "nodes", check=False)
    assert result.returncode != 0 and "You must be logged in to the server" in result.stderr


def test_rollout_status_of_a_daemonset_created_without_a_strategy(
    cluster: SimCluster, kubectl: str, kubeconfig: str, tmp_path: Path
) -> None:
    # Created without updateStrategy or revisionHistoryLimit: the server fills them in, as a real one does, and
    # `kubectl rollout status` (which refuses anything but RollingUpdate) follows the rollout to its end.
    bare = yaml.safe_load(yaml.safe_dump(DAEMONSET))
    bare["spec"].pop("updateStrategy")
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump(bare))
    _run(kubectl, kubeconfig, "create", "-f", str(path))
    status = _run(
        kubectl,
        kubeconfig,
        "rollout",
        "status",
        "daemonset/nvidia-device-plugin-daemonset",
        "-n",
        "kube-system",
        "--timeout=30s",
    )
    assert 'daemon set "nvidia-device-plugin-daemonset" successfully rolled out' in status.stdout
    live = json.loads(
        _run(
            kubectl, kubeconfig, "get", "ds", "nvidia-device-plugin-daemonset", "-n", "kube-system", "-o", "json"
        ).stdout
    )
    spec = live["spec"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert spec["revisionHistoryLimit"] == 10
    pod_spec = spec["template"]["spec"]
    assert (pod_spec["restartPolicy"], pod_spec["dnsPolicy"], pod_spec["schedulerName"]) == (
        "Always",
        "ClusterFirst",
        "default-scheduler",
    )
    container = pod_spec["containers"][0]
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert pod_spec["volumes"][0]["hostPath"]["type"] == ""

"""site.yml's drain window (playbooks/tasks/drain_window.yml) against kubesim, through kubegpu.node.node_cordon and
kubernetes.core.k8s_drain.

The harness (drain_window/harness.yml) runs site.yml's preflight and drain window for hosts reached with the local
connection; its steps inside the window (drain_window/steps.yml, stand-ins for the held-back restarts and reboots)
note that they ran, reboot the node in kubesim, or fail, and then clear what was held back (held-HOST.json, which the
test writes, as the real role chain persists a pending restart note or a reboot still required). What a user would
notice is asserted: which pods were evicted, whether PodDisruptionBudgets held, whether the node was waited on,
whether it ends cordoned, the record on the node, and the messages.

Cancels: AWX cancels a job with SIGTERM to ansible-runner's worker, then SIGKILL after a grace period; an execution
node that dies is a SIGKILL of everything at once. Each case stops a run at one step of the window, at a point the
test knows the run has reached (kubesim holds the drain's pod list; a PodDisruptionBudget refuses the eviction; the
steps write a marker and wait; the node stays NotReady), then starts the next run and checks that it finishes the node.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kubesim import SimCluster, SimNode
from kubesim.resources import BY_PLURAL

HARNESS = Path(__file__).resolve().parent / "drain_window" / "harness.yml"
RECORD = "kubegpu.node/cordon"
# Every wait in these tests is bounded by this (seconds); a run that does not get there fails the test.
BOUND = 90


def _command(
    ansible, cluster: SimCluster, hosts: dict, *args: str, **variables: Any
) -> tuple[list[str], dict[str, str]]:
    """A run of the harness over ``hosts``, the role chain off and its tags skipped (the harness's default): only
    site.yml's own tasks run on this machine."""
    inventory = ansible.inventory(
        hosts,
        kubegpu_kubeconfig=cluster.write_kubeconfig(str(ansible.workdir / "kubeconfig")),
        harness_dir=str(ansible.workdir),
        harness_sim_url=cluster.url,
        harness_token=cluster.token,
        **variables,
    )
    return ansible.command(HARNESS, *args, inventory=inventory)


def _run(ansible, cluster: SimCluster, hosts: dict, *args: str, **variables: Any):
    return ansible.run(*_command(ansible, cluster, hosts, *args, **variables))


def _hold(tmp_path: Path, host: str, held: list[str]) -> None:
    """What the stand-in role chain holds back on ``host`` until the window's steps apply it."""
    (tmp_path / f"held-{host}.json").write_text(json.dumps(held))


def _held(tmp_path: Path, host: str) -> list[str]:
    path = tmp_path / f"held-{host}.json"
    return json.loads(path.read_text()) if path.exists() else []


def _runs_of_steps(tmp_path: Path, host: str) -> list[str]:
    """The runs (harness_run) in which the held-back steps ran on ``host``."""
    path = tmp_path / f"ran-{host}"
    return path.read_text().split() if path.exists() else []


def _pod(cluster: SimCluster, name: str, node: str) -> None:
    cluster.create_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": {"app": "train"},
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train", "uid": "u1", "controller": True}
                ],
            },
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer", "command": ["train"]}]},
        }
    )


def _running(cluster: SimCluster, *names: str) -> bool:
    return cluster.wait_for(
        lambda: all(
            (cluster.get_object("pod", name, "default") or {}).get("status", {}).get("phase") == "Running"
            for name in names
        )
    )


def _budget(cluster: SimCluster, min_available: int) -> None:
    cluster.create_object(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "train"}}},
        }
    )


def _cordoned(cluster: SimCluster, node: str) -> bool:
    return bool(cluster.get_object("node", node)["spec"].get("unschedulable"))


def _record(cluster: SimCluster, node: str) -> dict | None:
    raw = (cluster.get_object("node", node)["metadata"].get("annotations") or {}).get(RECORD)
    return None if raw is None else json.loads(raw)


def _operator_cordons(cluster: SimCluster, node: str) -> None:
    cluster.api.mutate(
        BY_PLURAL["nodes"], None, node, lambda obj: obj["spec"].update(unschedulable=True), "an-operator"
    )


def _cluster() -> SimCluster:
    return SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4), SimNode("gpu-c", gpus=4)])


def test_drain_reboot_wait_and_uncordon_only_what_this_run_cordoned(ansible, tmp_path):
    with _cluster() as cluster:
        _pod(cluster, "train-a", "gpu-a")
        _pod(cluster, "train-b", "gpu-b")
        _pod(cluster, "train-c", "gpu-c")
        _budget(cluster, 1)  # three healthy pods, one needed: the two evictions (gpu-a, gpu-c) are allowed
        assert _running(cluster, "train-a", "train-b", "train-c")
        _operator_cordons(cluster, "gpu-c")
        boot_before = cluster.get_object("node", "gpu-a")["status"]["nodeInfo"]["bootID"]
        _hold(tmp_path, "gpu-a", ["reboot"])
        _hold(tmp_path, "gpu-c", ["containerd.service"])
        _hold(tmp_path, "new-host", ["containerd.service"])
        completed = _run(ansible, cluster, {"gpu-a": {}, "gpu-c": {}, "new-host": {}}, kubegpu_drain_timeout=60)
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output

        # gpu-a: its pod was evicted (the budget allowed one), the node rebooted, was waited on, and uncordoned; the
        # record went with the cordon.
        assert cluster.get_object("pod", "train-a", "default") is None
        assert cluster.get_object("pod", "train-b", "default") is not None
        assert "FAILED - RETRYING: [gpu-a -> localhost]: Wait until the node is Ready in the API, gpu-a" in output
        node_a = cluster.get_object("node", "gpu-a")
        assert node_a["status"]["nodeInfo"]["bootID"] != boot_before
        assert next(c for c in node_a["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
        assert not _cordoned(cluster, "gpu-a")
        assert _record(cluster, "gpu-a") is None
        # gpu-c was cordoned by someone else before the run: drained, never marked, and it stays cordoned.
        assert _cordoned(cluster, "gpu-c")
        assert _record(cluster, "gpu-c") is None
        assert "Node gpu-c was cordoned before this run (it has no kubegpu.node/cordon record)" in output
        # new-host is not a node yet: its steps ran without any drain.
        assert "new-host is not a node of the cluster" in output
        assert {h: _runs_of_steps(tmp_path, h) for h in ("gpu-a", "gpu-c", "new-host")} == {
            "gpu-a": ["1"],
            "gpu-c": ["1"],
            "new-host": ["1"],
        }
        assert not any(_held(tmp_path, h) for h in ("gpu-a", "gpu-c", "new-host"))

        # A second run holds nothing back: no window opens, nothing is written to the cluster.
        cluster.reset_counts()
        again = _run(ansible, cluster, {"gpu-a": {}, "gpu-c": {}, "new-host": {}}, harness_run=2)
        assert again.returncode == 0, again.stdout
        assert "Drain window for" not in again.stdout
        writes = {k: v for k, v in cluster.request_counts()["by_verb_resource"].items() if k[0] not in ("get", "list")}
        assert writes == {}


def test_a_failed_window_leaves_the_node_cordoned_with_its_record_and_the_next_run_finishes_it(ansible, tmp_path):
    with _cluster() as cluster:
        _pod(cluster, "train-a", "gpu-a")
        _budget(cluster, 1)
        assert _running(cluster, "train-a")
        _hold(tmp_path, "gpu-a", ["containerd.service"])
        _hold(tmp_path, "gpu-b", ["containerd.service"])
        completed = _run(ansible, cluster, {"gpu-a": {}, "gpu-b": {"harness_fail_step": True}}, kubegpu_drain_timeout=6)
        output = completed.stdout + completed.stderr
        assert completed.returncode != 0, output
        # The budget held: the pod is still there, the steps never ran on gpu-a, and it says what to do.
        assert cluster.get_object("pod", "train-a", "default") is not None
        assert _runs_of_steps(tmp_path, "gpu-a") == []
        assert _cordoned(cluster, "gpu-a")
        record = _record(cluster, "gpu-a")
        assert record is not None and record["by"] == "kubegpu.node site.yml"
        assert record["reason"] == "held back for a drain window: containerd.service"
        assert record["undo"] == "kubectl uncordon gpu-a && kubectl annotate node gpu-a kubegpu.node/cordon-"
        assert 'gpu-a (node gpu-a): the drain window failed at "drain" while applying containerd.service' in output
        assert "Cannot evict pod as it would violate the pod's disruption budget" in output
        assert "The node stays cordoned, with the record kubegpu.node/cordon on it" in output
        assert "`kubectl uncordon gpu-a && kubectl annotate node gpu-a kubegpu.node/cordon-`" in output
        # gpu-b was drained, its restart failed: it stays cordoned with its record, and the message names the step.
        assert _runs_of_steps(tmp_path, "gpu-b") == ["1"]
        assert _cordoned(cluster, "gpu-b") and _record(cluster, "gpu-b") is not None
        assert 'gpu-b (node gpu-b): the drain window failed at "apply containerd.service"' in output
        assert "containerd did not come back (test)" in output
        assert _held(tmp_path, "gpu-b") == ["containerd.service"]

        # The cause fixed (the budget relaxed, the restart works), the next run finishes both nodes.
        cluster.delete_object("poddisruptionbudget", "train", "default")
        again = _run(ansible, cluster, {"gpu-a": {}, "gpu-b": {}}, harness_run=2, kubegpu_drain_timeout=30)
        assert again.returncode == 0, again.stdout + again.stderr
        assert cluster.get_object("pod", "train-a", "default") is None
        for node in ("gpu-a", "gpu-b"):
            assert not _cordoned(cluster, node) and _record(cluster, node) is None
            assert _runs_of_steps(tmp_path, node)[-1] == "2"


def test_check_mode_drains_nothing_and_says_what_the_window_would_do(ansible, tmp_path):
    with _cluster() as cluster:
        _pod(cluster, "train-a", "gpu-a")
        assert _running(cluster, "train-a")
        # gpu-b carries the cordon and record of an earlier run that was cancelled after its reboot.
        cluster.api.mutate(
            BY_PLURAL["nodes"],
            None,
            "gpu-b",
            lambda obj: (
                obj["spec"].update(unschedulable=True),
                obj["metadata"]
                .setdefault("annotations", {})
                .update(
                    {RECORD: json.dumps({"by": "kubegpu.node site.yml", "reason": "held back: reboot", "at": "T"})}
                ),
            ),
            "kubegpu.node",
        )
        _hold(tmp_path, "gpu-a", ["containerd.service"])
        cluster.reset_counts()
        completed = _run(ansible, cluster, {"gpu-a": {}, "gpu-b": {}}, "--check")
        assert completed.returncode == 0, completed.stdout
        assert (
            "would cordon and drain node gpu-a, then apply what was held back (containerd.service)" in completed.stdout
        )
        assert (
            "gpu-b: node gpu-b is cordoned by an earlier run of kubegpu.node that did not finish"
            " (held back: reboot, T); would wait until it is Ready and uncordon it"
            " (nothing is held back any more: no drain)."
        ) in completed.stdout
        assert not _cordoned(cluster, "gpu-a")
        assert _cordoned(cluster, "gpu-b") and _record(cluster, "gpu-b") is not None
        assert cluster.get_object("pod", "train-a", "default") is not None
        assert not list(tmp_path.glob("ran-*"))
        writes = {
            k: v
            for k, v in cluster.request_counts()["by_verb_resource"].items()
            if k[0] not in ("get", "list", "watch")
        }
        assert writes == {}


# ----- Cancelled inside the window, then run again ----------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it (ansible-playbook's workers start sessions of their own, so a signal to its
    process group does not reach them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(children.get(current, []))
    return found


def _cancel(process: subprocess.Popen, how: str) -> None:
    """Cancel the run as AWX does: SIGTERM to ansible-playbook's process group, then SIGKILL to whatever is left after
    a grace period; or SIGKILL to every process of the run at once (an execution node that died)."""
    tree = _tree(process.pid)
    if how == "SIGTERM":
        os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=BOUND)


def _until(predicate, what: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        if predicate():
            return
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    pytest.fail(f"the run did not reach {what} (exit {process.poll()}):\n{log.read_text()[-6000:]}")


# Each step of the window: where the run is stopped, what was held back, and whether something is still held back
# when the next run starts (then it drains again and applies it; otherwise it only waits and uncordons).
STEPS = {
    "after cordon": (["reboot"], True),
    "during a drain blocked by a PodDisruptionBudget": (["containerd.service"], True),
    "after the restart or reboot": (["reboot"], False),
    "before uncordon": (["containerd.service"], False),
}


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("step", list(STEPS))
def test_a_run_cancelled_inside_the_window_is_finished_by_the_next_run(ansible, tmp_path, step, how):
    held, still_held = STEPS[step]
    with _cluster() as cluster:
        _pod(cluster, "train-a", "gpu-a")
        assert _running(cluster, "train-a")
        _hold(tmp_path, "gpu-a", held)
        # gpu-b, in the same batch, was cordoned by an operator before the run: its cordon survives both runs.
        _operator_cordons(cluster, "gpu-b")
        _hold(tmp_path, "gpu-b", ["containerd.service"])
        hosts: dict[str, dict] = {"gpu-a": {}, "gpu-b": {}}
        variables: dict[str, Any] = {"kubegpu_drain_timeout": BOUND, "kubegpu_node_ready_timeout": BOUND}
        if step == "after cordon":
            # The drain lists the node's pods right after the cordon: kubesim keeps that request waiting.
            cluster.hold(verbs=["list"], path_regex="^/api/v1/pods$", seconds=BOUND)
        elif step == "during a drain blocked by a PodDisruptionBudget":
            _budget(cluster, 1)  # one healthy pod, one needed: every eviction is refused
        elif step == "after the restart or reboot":
            hosts["gpu-a"]["harness_pause_after_apply"] = True
        else:
            # The node does not come back Ready: the window waits for it, before its uncordon.
            cluster.set_fault("gpu-a", "not_ready")

        log = tmp_path / "cancelled-run.log"
        process = ansible.start(*_command(ansible, cluster, hosts, **variables), log, own_session=True)
        try:
            if step == "after cordon":
                _until(lambda: cluster.held() >= 2 and _record(cluster, "gpu-a"), "the drain's pod list", process, log)
            elif step == "during a drain blocked by a PodDisruptionBudget":
                _until(
                    lambda: (
                        ("create", "pods/eviction", 429) in {e[1:] for e in cluster.request_log()}
                        and "FAILED - RETRYING: [gpu-a -> localhost]: Drain node gpu-a" in log.read_text()
                    ),
                    "an eviction refused by the budget",
                    process,
                    log,
                )
            elif step == "after the restart or reboot":
                _until((tmp_path / "applied-gpu-a").exists, "the marker after the reboot", process, log)
            else:
                _until(
                    lambda: "FAILED - RETRYING: [gpu-a -> localhost]: Wait until the node is Ready" in log.read_text(),
                    "the wait for Ready",
                    process,
                    log,
                )
            _cancel(process, how)
        finally:
            cluster.release()
            if process.poll() is None:
                process.kill()
        cancelled = log.read_text()
        assert "PLAY RECAP" not in cancelled, cancelled

        # What the cancel left: gpu-a cordoned with the record, gpu-b cordoned as the operator left it.
        assert _cordoned(cluster, "gpu-a"), cancelled
        record = _record(cluster, "gpu-a")
        assert record is not None and record["reason"] == f"held back for a drain window: {held[0]}", record
        assert (_held(tmp_path, "gpu-a") != []) is still_held
        assert _cordoned(cluster, "gpu-b") and _record(cluster, "gpu-b") is None

        # Between the runs: the node comes back; the budget goes; a pod is bound to gpu-a (as a DaemonSet's would be,
        # whatever the cordon): a drain in the next run evicts it, a run that only finishes leaves it. gpu-b has a
        # restart held back again, so that its window opens in the next run too.
        cluster.clear_fault("gpu-a")
        if cluster.get_object("poddisruptionbudget", "train", "default") is not None:
            cluster.delete_object("poddisruptionbudget", "train", "default")
        _hold(tmp_path, "gpu-b", ["containerd.service"])
        _pod(cluster, "late-a", "gpu-a")
        assert _running(cluster, "late-a")
        steps_before = _runs_of_steps(tmp_path, "gpu-a")

        again = _run(ansible, cluster, {"gpu-a": {}, "gpu-b": {}}, harness_run=2, **variables)
        output = again.stdout + again.stderr
        assert again.returncode == 0, output
        # The next run finished gpu-a: Ready, uncordoned, the record gone.
        node_a = cluster.get_object("node", "gpu-a")
        assert next(c for c in node_a["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
        assert not _cordoned(cluster, "gpu-a") and _record(cluster, "gpu-a") is None, output
        assert _held(tmp_path, "gpu-a") == []
        # It drained and applied again only when something was still held back.
        assert (cluster.get_object("pod", "late-a", "default") is None) is still_held, output
        assert (_runs_of_steps(tmp_path, "gpu-a") == [*steps_before, "2"]) is still_held, output
        if still_held:
            assert cluster.get_object("pod", "train-a", "default") is None
        else:
            assert cluster.get_object("pod", "late-a", "default")["status"]["phase"] == "Running"
        # The operator's cordon survived both runs, never marked as this collection's.
        assert _cordoned(cluster, "gpu-b") and _record(cluster, "gpu-b") is None
        assert "Node gpu-b was cordoned before this run (it has no kubegpu.node/cordon record)" in output

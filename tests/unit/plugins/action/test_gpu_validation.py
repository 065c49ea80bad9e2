"""The wait of kubegpu.node.gpu_validation over scripted reads, with the clock as a parameter."""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible_collections.kubegpu.node.plugins.action.gpu_validation import READ_FAILURES_ALLOWED, wait_for_pods
from ansible_collections.kubegpu.node.plugins.plugin_utils import _gpu_validation as gv


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def smi(node: str, phase: str) -> dict:
    return {
        "metadata": {"name": f"kubegpu-smi-{node}-r1", "annotations": {gv.NODE_ANNOTATION: node}},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def test_the_wait_ends_as_soon_as_every_pod_is_settled():
    clock = Clock()
    answers = iter(
        [
            [smi("a", "Pending"), smi("b", "Running")],
            [smi("a", "Succeeded"), smi("b", "Running")],
            [smi("a", "Succeeded"), smi("b", "Failed")],
        ]
    )
    result = wait_for_pods(lambda: next(answers), "smi", ["a", "b"], 300, clock=clock, sleep=clock.sleep, poll=2)
    assert result["unsettled"] == [] and result["error"] is None
    assert result["waited"] == 4.0 and clock.sleeps == [2, 2]
    assert [p["status"]["phase"] for p in result["pods"]] == ["Succeeded", "Failed"]


def test_the_wait_never_outlasts_its_timeout_and_reports_what_it_saw():
    clock = Clock()
    reads = []

    def read():
        reads.append(clock.now)
        return [smi("a", "Succeeded"), smi("b", "Pending")]

    result = wait_for_pods(read, "smi", ["a", "b"], 9, clock=clock, sleep=clock.sleep, poll=2)
    assert result["unsettled"] == ["b"]
    assert result["waited"] <= 9 and len(reads) == 5
    assert result["pods"][1]["status"]["phase"] == "Pending"


def test_failing_reads_are_retried_then_reported():
    clock = Clock()
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise AnsibleError("Failed to get client due to HTTPSConnectionPool: connection refused")
        return [smi("a", "Succeeded")]

    result = wait_for_pods(flaky, "smi", ["a"], 60, clock=clock, sleep=clock.sleep, poll=1)
    assert result["error"] is None and result["unsettled"] == []

    def broken():
        raise AnsibleError("Failed to get client due to 401 Unauthorized")

    clock = Clock()
    result = wait_for_pods(broken, "smi", ["a"], 60, clock=clock, sleep=clock.sleep, poll=1)
    assert result["error"] == "reading the smi pods failed: Failed to get client due to 401 Unauthorized"
    assert result["unsettled"] == ["a"] and clock.sleeps == [1] * (READ_FAILURES_ALLOWED - 1)

"""The event-driven wait, over a scripted fake API: list, watch, 410 Gone, dropped streams, the deadline."""

from __future__ import annotations

import copy

import pytest
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.client import (
    retry_after_seconds,
    retry_delay,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.errors import (
    KubeApiError,
    WatchGone,
    WatchInterrupted,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.plugin_config import capacity_plan
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.waiter import (
    MIN_RELIST_INTERVAL,
    REFRESH_BUDGET,
    CapacityWait,
    diagnose_timeout,
    refresh_pending,
    wait_for_capacity,
)

POD_SPEC = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def with_gpus(node, count, version):
    node = copy.deepcopy(node)
    node["metadata"]["resourceVersion"] = version
    node["status"]["capacity"]["nvidia.com/gpu"] = str(count)
    node["status"]["allocatable"]["nvidia.com/gpu"] = str(count)
    return node


class ScriptedApi:
    """Answers lists with the current nodes and each watch with the next scripted step."""

    def __init__(self, nodes, watch_steps, clock, pods=(), logs=None):
        self.nodes = nodes
        self.steps = list(watch_steps)
        self.clock = clock
        self.pods = list(pods)
        self.logs = logs or {}
        self.calls = []
        self.times = []
        self.get_error = None

    def request(self, method, path, query=None, body=None, content_type=None, timeout=30.0, deadline=None):
        self.calls.append(("list", path, query))
        self.times.append(("list", self.clock.now))
        if path == "/api/v1/nodes":
            return {"metadata": {"resourceVersion": "10"}, "items": copy.deepcopy(self.nodes)}
        return {"items": copy.deepcopy(self.pods)}

    def get_or_none(self, path, query=None, deadline=None):
        self.calls.append(("get", path, deadline))
        if self.get_error is not None:
            raise self.get_error
        name = path.rsplit("/", 1)[-1]
        found = [n for n in self.nodes if n["metadata"]["name"] == name]
        return copy.deepcopy(found[0]) if found else None

    def get_text(self, path, query=None, timeout=10.0):
        self.calls.append(("log", path, query))
        return self.logs.get(path.split("/")[-2], "")

    def watch(self, path, query, timeout):
        self.calls.append(("watch", path, query))
        self.times.append(("watch", self.clock.now))
        step = self.steps.pop(0) if self.steps else ("idle",)
        if step[0] == "empty":
            return
        if step[0] == "throttled":
            raise WatchInterrupted("HTTP 429", retry_after=step[1])
        if step[0] == "bookmarks":
            # A server that ignores timeoutSeconds and sends only bookmarks, forever; the client's deadline ends it.
            while True:
                self.clock.now += 0.5
                yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "10"}}}
        if step[0] == "gone":
            raise WatchGone()
        if step[0] == "drop":
            yield from step[1]
            raise WatchInterrupted("connection reset")
        if step[0] == "idle":
            self.clock.now += timeout
            return
        for event in step[1]:
            self.clock.now += 0.1
            yield event


def test_done_at_first_list_needs_no_watch(fixture):
    clock = Clock()
    api = ScriptedApi([fixture("node_gpu_ready.json")], [], clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-1": 8})
    outcome = wait_for_capacity(api, tracker, 30, clock=clock, sleep=clock.sleep)
    assert outcome == {"done": True, "waited": 0.0, "lists": 1, "watches": 0}


def test_capacity_arrives_by_watch(fixture):
    clock = Clock()
    node = fixture("node_no_capacity.json")
    events = [
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "11"}}},
        {"type": "MODIFIED", "object": with_gpus(node, 4, "12")},
        {"type": "MODIFIED", "object": with_gpus(node, 8, "13")},
    ]
    api = ScriptedApi([node], [("events", events)], clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8})
    outcome = wait_for_capacity(api, tracker, 30, clock=clock, sleep=clock.sleep)
    assert outcome["done"] is True
    assert (outcome["lists"], outcome["watches"]) == (1, 1)
    assert api.calls[1][2]["resourceVersion"] == "10"
    assert tracker.states["gpu-a100-2"]["capacity"] == 8


def test_gone_leads_to_a_fresh_list_and_a_dropped_watch_resumes(fixture):
    clock = Clock()
    node = fixture("node_no_capacity.json")
    steps = [("gone",), ("drop", [{"type": "MODIFIED", "object": with_gpus(node, 2, "11")}]), ("gone",)]
    api = ScriptedApi([node], steps, clock)
    lists_seen = []
    answer_list = api.request

    def request(method, path, query=None, **kwargs):
        lists_seen.append(path)
        if len(lists_seen) == 3:
            # By the third list the node has all of its GPUs.
            api.nodes = [with_gpus(node, 8, "20")]
        return answer_list(method, path, query, **kwargs)

    api.request = request
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8})
    outcome = wait_for_capacity(api, tracker, 30, clock=clock, sleep=clock.sleep)
    assert outcome["done"] is True
    # gone -> list; drop -> watch again from resourceVersion 11 (no list); gone -> list, which finds 8 GPUs.
    assert (outcome["lists"], outcome["watches"]) == (3, 3)
    watch_versions = [call[2]["resourceVersion"] for call in api.calls if call[0] == "watch"]
    assert watch_versions == ["10", "10", "11"]
    list_times = [t for kind, t in api.times if kind == "list"]
    assert all(b - a >= MIN_RELIST_INTERVAL for a, b in zip(list_times, list_times[1:]))


def test_watch_that_ends_at_once_backs_off_and_lists_at_most_once_a_second(fixture):
    clock = Clock()
    api = ScriptedApi([fixture("node_no_capacity.json")], [("empty",)] * 1000, clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8})
    outcome = wait_for_capacity(api, tracker, 30, clock=clock, sleep=clock.sleep)
    assert outcome["done"] is False
    assert outcome["waited"] == 30.0
    list_times = [t for kind, t in api.times if kind == "list"]
    assert all(b - a >= MIN_RELIST_INTERVAL for a, b in zip(list_times, list_times[1:]))
    # Backoff from 0.5 s doubling up to 10 s (with jitter): a few watches in 30 s, not a hot loop.
    assert outcome["watches"] <= 10
    assert outcome["lists"] == outcome["watches"]


def test_throttled_watch_waits_retry_after_and_does_not_list_again(fixture):
    clock = Clock()
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        clock.sleep(seconds)

    api = ScriptedApi([fixture("node_no_capacity.json")], [("throttled", 2)] * 1000, clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8})
    outcome = wait_for_capacity(api, tracker, 20, clock=clock, sleep=sleep)
    assert outcome["lists"] == 1
    assert min(slept[:-1]) >= 2.0
    assert outcome["watches"] <= 10
    assert outcome["waited"] == 20.0


def test_deadline_holds_when_the_server_sends_only_bookmarks(fixture):
    clock = Clock()
    api = ScriptedApi([fixture("node_no_capacity.json")], [("bookmarks",)], clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8})
    outcome = wait_for_capacity(api, tracker, 5, clock=clock, sleep=clock.sleep)
    assert outcome["done"] is False
    assert outcome["waited"] == 5.0


def test_timeout_is_bounded_and_reports_pending(fixture):
    clock = Clock()
    api = ScriptedApi([fixture("node_no_capacity.json")], [("idle",)], clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8, "gpu-missing": 2})
    outcome = wait_for_capacity(api, tracker, 5, clock=clock, sleep=clock.sleep)
    assert outcome["done"] is False
    assert outcome["waited"] == 5.0
    assert tracker.pending == {"gpu-a100-2", "gpu-missing"}


def test_selection_without_expected_counts_follows_events(fixture):
    clock = Clock()
    ready = fixture("node_gpu_ready.json")
    control_plane = fixture("node_control_plane.json")
    api = ScriptedApi([ready, control_plane], [], clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC)
    outcome = wait_for_capacity(api, tracker, 5, clock=clock, sleep=clock.sleep)
    assert outcome["done"] is True
    assert set(tracker.states) == {"gpu-a100-1"}


def test_node_selector_is_sent_as_label_selector(fixture):
    clock = Clock()
    api = ScriptedApi([fixture("node_gpu_ready.json")], [], clock)
    spec = dict(POD_SPEC, nodeSelector={"b": "2", "a": "1"})
    tracker = CapacityWait(capacity_plan(None), spec)
    wait_for_capacity(api, tracker, 5, clock=clock, sleep=clock.sleep)
    assert api.calls[0][2] == {"labelSelector": "a=1,b=2"}


def test_no_selected_node_is_not_success(fixture):
    clock = Clock()
    api = ScriptedApi([fixture("node_control_plane.json")], [("idle",)], clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC)
    outcome = wait_for_capacity(api, tracker, 3, clock=clock, sleep=clock.sleep)
    assert outcome["done"] is False
    assert diagnose_timeout(api, tracker, "kube-system") == [
        "no node matches the plugin's node_selector, affinity and tolerations, so none can report GPUs"
    ]


def test_diagnosis_reads_pods_once_and_logs_only_of_failing_pods(fixture):
    clock = Clock()
    nodes = [fixture("node_gpu_ready.json"), fixture("node_no_capacity.json"), fixture("node_unhealthy.json")]
    healthy_pod = fixture("pod_running.json")
    healthy_pod["spec"]["nodeName"] = "gpu-a100-1"
    failing_pod = fixture("pod_running.json")
    failing_pod["metadata"]["name"] = "dp-failing"
    unhealthy_pod = fixture("pod_running.json")
    unhealthy_pod["metadata"]["name"] = "dp-unhealthy"
    unhealthy_pod["spec"]["nodeName"] = "gpu-a100-4"
    api = ScriptedApi(
        nodes,
        [("idle",)],
        clock,
        pods=[healthy_pod, failing_pod, unhealthy_pod],
        logs={"dp-failing": fixture("log_nvml.txt")},
    )
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-1": 8, "gpu-a100-2": 8, "gpu-a100-4": 8})
    wait_for_capacity(api, tracker, 2, clock=clock, sleep=clock.sleep)
    api.calls.clear()
    messages = diagnose_timeout(api, tracker, "kube-system")
    assert len(messages) == 2
    assert "default runtime is not nvidia" in messages[0]
    assert "2 of 8 nvidia.com/gpu unhealthy" in messages[1]
    kinds = [call[0] for call in api.calls]
    assert kinds.count("list") == 1
    log_calls = [call for call in api.calls if call[0] == "log"]
    assert [call[1] for call in log_calls] == [
        "/api/v1/namespaces/kube-system/pods/dp-failing/log",
        "/api/v1/namespaces/kube-system/pods/dp-unhealthy/log",
    ]
    assert log_calls[0][2]["tailLines"] == 20


class ForbiddenPodsApi(ScriptedApi):
    """Nodes are readable, pods are not (narrow RBAC)."""

    def request(self, method, path, query=None, body=None, content_type=None, timeout=30.0, deadline=None):
        if "/pods" in path:
            self.calls.append(("list", path, query))
            raise KubeApiError(
                403, "Forbidden", method, path, b'{"reason": "Forbidden", "message": "pods is forbidden"}'
            )
        return super().request(method, path, query, body, content_type, timeout)


def test_diagnosis_falls_back_to_the_nodes_when_pods_are_forbidden(fixture):
    clock = Clock()
    api = ForbiddenPodsApi([fixture("node_gpu_ready.json"), fixture("node_no_capacity.json")], [("idle",)], clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-1": 8, "gpu-a100-2": 8})
    wait_for_capacity(api, tracker, 2, clock=clock, sleep=clock.sleep)
    messages = diagnose_timeout(api, tracker, "kube-system", "nvidia-device-plugin-daemonset")
    assert len(messages) == 1
    assert messages[0].startswith("gpu-a100-2: reports 0 nvidia.com/gpu")
    assert "expected 8" in messages[0]
    assert "403 Forbidden" in messages[0]
    assert "allow list on pods" in messages[0]


class EventsApi(ScriptedApi):
    def __init__(self, *args, events=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.events = list(events)

    def request(self, method, path, query=None, body=None, content_type=None, timeout=30.0, deadline=None):
        if path.endswith("/events"):
            self.calls.append(("list", path, query))
            return {"items": copy.deepcopy(self.events)}
        return super().request(method, path, query, body, content_type, timeout)


def test_diagnosis_names_why_the_daemonset_creates_no_pods(fixture):
    clock = Clock()
    failed_create = {
        "reason": "FailedCreate",
        "lastTimestamp": "2026-11-22T05:00:00Z",
        "message": 'Error creating: pods "nvidia-device-plugin-daemonset-" is forbidden: pod rejected: '
        'RuntimeClass "nvidia" not found',
    }
    older = dict(failed_create, lastTimestamp="2026-11-22T04:00:00Z", message="an older failure")
    api = EventsApi([fixture("node_no_capacity.json")], [("idle",)], clock, events=[older, failed_create])
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8})
    wait_for_capacity(api, tracker, 2, clock=clock, sleep=clock.sleep)
    api.calls.clear()
    messages = diagnose_timeout(api, tracker, "kube-system", "nvidia-device-plugin-daemonset")
    assert len(messages) == 1
    assert "no device plugin pod on this node" in messages[0]
    assert (
        'the DaemonSet cannot create its pods: Error creating: pods "nvidia-device-plugin-daemonset-" is forbidden'
        in messages[0]
    )
    assert 'RuntimeClass "nvidia" not found' in messages[0]
    events_query = [query for kind, path, query in api.calls if path.endswith("/events")]
    assert events_query == [
        {
            "fieldSelector": "involvedObject.kind=DaemonSet,involvedObject.name=nvidia-device-plugin-daemonset,"
            "reason=FailedCreate"
        }
    ]


def test_retry_delay_honours_retry_after_and_backs_off_with_jitter():
    # Retry-After is a floor, with at most 10 % added.
    assert retry_delay(1, 1.0, rng=lambda: 0.0) == 1.0
    assert retry_delay(7, 3.0, rng=lambda: 1.0) == pytest.approx(3.3)
    # Without it: half fixed, half random, doubling from 0.5 s up to 10 s.
    assert [retry_delay(n, None, rng=lambda: 0.0) for n in (1, 2, 3, 4, 5, 6, 7)] == [
        0.25,
        0.5,
        1.0,
        2.0,
        4.0,
        5.0,
        5.0,
    ]
    assert [retry_delay(n, None, rng=lambda: 1.0) for n in (1, 2, 3, 6)] == [0.5, 1.0, 2.0, 10.0]


def test_retry_after_header_is_read_as_whole_seconds():
    assert retry_after_seconds({"Retry-After": "1"}) == 1.0
    assert retry_after_seconds({"Retry-After": " 30 "}) == 30.0
    assert retry_after_seconds({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_after_seconds({}) is None
    assert retry_after_seconds(None) is None


# ----- the fresh read at the deadline (issue 17, item 6: a throttled watch must not blame nodes that reported) -----


def _throttled_after_list(fixture, clock, late_nodes):
    """Every watch answers 429; the nodes change right after the first list, so only a fresh read can see it."""
    api = ScriptedApi([fixture("node_no_capacity.json")], [("throttled", 1)] * 1000, clock)
    original = api.request

    def request(*args, **kwargs):
        answer = original(*args, **kwargs)
        api.nodes = late_nodes
        return answer

    api.request = request
    return api


def test_a_watch_throttled_for_the_whole_wait_leaves_the_first_list_and_a_fresh_read_corrects_it(fixture):
    clock = Clock()
    reported = with_gpus(fixture("node_no_capacity.json"), 8, "11")
    api = _throttled_after_list(fixture, clock, [reported])
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8})
    outcome = wait_for_capacity(api, tracker, 20, clock=clock, sleep=clock.sleep)
    # What the wait saw: only the list from its start.
    assert outcome["done"] is False and outcome["lists"] == 1
    assert tracker.states["gpu-a100-2"]["capacity"] == 0
    assert refresh_pending(api, tracker, clock=clock) is None
    assert tracker.complete()
    assert [c[:2] for c in api.calls if c[0] == "get"] == [("get", "/api/v1/nodes/gpu-a100-2")]
    # The read has a budget of its own, measured on the clock it was given.
    assert api.calls[-1][2] == clock.now + REFRESH_BUDGET


def test_the_diagnosis_after_a_fresh_read_names_only_what_is_still_wrong(fixture):
    clock = Clock()
    late = with_gpus(fixture("node_no_capacity.json"), 8, "11")
    still_missing = fixture("node_no_capacity.json")
    still_missing["metadata"]["name"] = "gpu-stuck"
    api = _throttled_after_list(fixture, clock, [late, still_missing])
    api.nodes = [fixture("node_no_capacity.json"), still_missing]
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8, "gpu-stuck": 8})
    wait_for_capacity(api, tracker, 10, clock=clock, sleep=clock.sleep)
    assert tracker.pending == {"gpu-a100-2", "gpu-stuck"}
    refresh_pending(api, tracker, clock=clock)
    assert tracker.pending == {"gpu-stuck"}
    messages = diagnose_timeout(api, tracker, "kube-system")
    assert len(messages) == 1 and messages[0].startswith("gpu-stuck: ")


def test_a_node_deleted_meanwhile_is_found_missing(fixture):
    clock = Clock()
    api = _throttled_after_list(fixture, clock, [])
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8})
    wait_for_capacity(api, tracker, 5, clock=clock, sleep=clock.sleep)
    refresh_pending(api, tracker, clock=clock)
    assert tracker.states["gpu-a100-2"]["found"] is False
    assert diagnose_timeout(api, tracker, "kube-system")[0].startswith("gpu-a100-2: node not found")


def test_many_pending_nodes_are_read_in_one_list(fixture):
    clock = Clock()
    names = [f"gpu-{i}" for i in range(12)]
    nodes = []
    for name in names:
        node = fixture("node_no_capacity.json")
        node["metadata"]["name"] = name
        nodes.append(node)
    api = ScriptedApi(nodes, [("throttled", 1)] * 1000, clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected=dict.fromkeys(names, 8))
    wait_for_capacity(api, tracker, 5, clock=clock, sleep=clock.sleep)
    api.nodes = [with_gpus(n, 8, "12") for n in nodes]
    lists_before = sum(1 for c in api.calls if c[0] == "list")
    refresh_pending(api, tracker, clock=clock)
    assert tracker.complete()
    assert sum(1 for c in api.calls if c[0] == "list") == lists_before + 1
    assert not [c for c in api.calls if c[0] == "get"]


def test_a_fresh_read_that_fails_says_why_and_keeps_what_was_seen(fixture):
    clock = Clock()
    api = ScriptedApi([fixture("node_no_capacity.json")], [("throttled", 1)] * 1000, clock)
    tracker = CapacityWait(capacity_plan(None), POD_SPEC, expected={"gpu-a100-2": 8})
    wait_for_capacity(api, tracker, 5, clock=clock, sleep=clock.sleep)
    body = b'{"kind":"Status","reason":"TooManyRequests","message":"Too many requests, please try again later."}'
    api.get_error = KubeApiError(429, "Too Many Requests", "GET", "/api/v1/nodes/gpu-a100-2", body)
    error = refresh_pending(api, tracker, clock=clock)
    assert error == "429 TooManyRequests: Too many requests, please try again later."
    assert tracker.pending == {"gpu-a100-2"}

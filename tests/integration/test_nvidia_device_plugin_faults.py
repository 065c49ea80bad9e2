"""kubegpu.node.nvidia_device_plugin against an API server that throttles or misbehaves (tests/kubesim/faults.py):
429 with Retry-After, watches that end at once, watches that send only bookmarks or blank lines past their timeout,
and error answers whose body comes after the status line."""

from __future__ import annotations

import time

import pytest
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.client import KubeClient, load_configuration
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.errors import WatchInterrupted
from kubesim import SimCluster, SimNode
from nvidia_device_plugin_harness import auth_args, run_module

NODES = "/api/v1/nodes"


def args(cluster, **extra):
    values = dict(auth_args(cluster), wait_timeout=15)
    values.update(extra)
    return values


def node_requests(cluster, verbs=("list", "watch")):
    return [
        (t, verb, status)
        for t, verb, resource, status in cluster.request_log()
        if resource == "nodes" and verb in verbs
    ]


def gaps_after_throttling(requests):
    """Seconds between each 429 answer and the next request of the same kind of work (list or watch of nodes)."""
    return [later[0] - earlier[0] for earlier, later in zip(requests, requests[1:]) if earlier[2] == 429]


# 1. Throttling: Retry-After honoured, retries bounded by the deadline --------------------------------------------


def test_throttled_watch_waits_retry_after_before_asking_again():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=2.5) as cluster:
        cluster.throttle(share=1.0, retry_after=1, seconds=3.0, verbs=["watch"])
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2}))
        assert result.get("failed") is not True, result.get("msg")
        requests = node_requests(cluster)
    throttled = [r for r in requests if r[2] == 429]
    assert len(throttled) >= 2, requests
    # The server asked for 1 s between requests: the module never asks sooner, and never re-lists in between.
    assert min(gaps_after_throttling(requests)) >= 0.95, requests
    lists_while_throttled = [r for r in requests if r[1] == "list" and r[0] <= throttled[-1][0]]
    assert len(lists_while_throttled) <= len(throttled), requests


def test_throttled_list_is_retried_until_the_deadline_not_a_count():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=0.2) as cluster:
        cluster.throttle(share=1.0, retry_after=1, seconds=4.5, verbs=["list"], path_regex="^/api/v1/nodes$")
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2}))
        assert result.get("failed") is not True, result.get("msg")
        lists = node_requests(cluster, verbs=("list",))
    assert [status for _t, _v, status in lists].count(429) >= 4
    assert min(gaps_after_throttling(lists)) >= 0.95, lists


def test_throttled_apply_is_retried_until_the_deadline():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=0.2) as cluster:
        cluster.throttle(share=1.0, retry_after=1, seconds=4.5, verbs=["patch"])
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2}))
        assert result.get("failed") is not True, result.get("msg")
        patches = [r for r in cluster.request_log() if r[1] == "patch"]
    assert len(patches) >= 5
    assert all(b[0] - a[0] >= 0.95 for a, b in zip(patches, patches[1:])), patches


def test_throttling_past_the_deadline_fails_at_the_deadline_with_the_status():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=0.2) as cluster:
        cluster.throttle(share=1.0, retry_after=1, verbs=["list"], path_regex="^/api/v1/nodes$")
        started = time.monotonic()
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2}, wait_timeout=3))
        elapsed = time.monotonic() - started
    assert result["failed"] is True
    assert result["status"] == 429
    assert "throttling" in result["msg"]
    assert 2.0 <= elapsed <= 8.0


# 2. Watches that end at once: no hot loop -----------------------------------------------------------------------


def test_watch_that_ends_at_once_is_not_a_hot_loop():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=3.0) as cluster:
        cluster.set_watch_mode("ends_at_once")
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2}))
        assert result.get("failed") is not True, result.get("msg")
        requests = node_requests(cluster)
    lists = [r for r in requests if r[1] == "list"]
    watches = [r for r in requests if r[1] == "watch"]
    # About 3 s of empty watches: backing off from 0.5 s, a handful of watches; a list at most once a second.
    assert len(watches) <= 6, requests
    assert len(lists) <= 5, requests
    assert all(b[0] - a[0] >= 0.95 for a, b in zip(lists, lists[1:])), lists


# 3. The deadline holds whatever the server sends ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bookmarks_only", "trickle"])
def test_wait_timeout_is_a_deadline_when_the_watch_never_ends(mode):
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=0.1, faults={"gpu-1": "never_reports"}) as cluster:
        cluster.set_watch_mode(mode, interval=0.1, hold=12.0)
        started = time.monotonic()
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2}, wait_timeout=2))
        elapsed = time.monotonic() - started
    assert result["failed"] is True
    assert result["msg"].startswith("timed out after 2s waiting"), result["msg"]
    assert 2.0 <= result["waited"] <= 2.5
    # The whole run (apply and diagnosis included) ends long before the server would end the stream (12 s).
    assert elapsed < 8.0


def test_watches_ask_the_server_to_end_them_by_the_deadline():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], faults={"gpu-1": "never_reports"}) as cluster:
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2}, wait_timeout=2))
        assert result["failed"] is True
        assert 2.0 <= result["waited"] <= 2.5


# 4. An error body is read before the connection is used again ---------------------------------------------------


def test_error_body_is_read_before_the_connection_is_reused():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2}))
        assert result.get("failed") is not True, result.get("msg")
        (pod,) = cluster.list_objects("pods", "kube-system")
        log_path = f"/api/v1/namespaces/kube-system/pods/{pod['metadata']['name']}/log"
        configuration, _source = load_configuration(auth_args(cluster))
        client = KubeClient(configuration)
        # The next watch is throttled, and the Status body of the 429 arrives 0.5 s after its status line.
        cluster.set_error_body_delay(0.5)
        cluster.throttle(share=1.0, retry_after=1, verbs=["watch"])
        with pytest.raises(WatchInterrupted):
            list(client.watch(NODES, {"resourceVersion": "1"}, timeout=5))
        cluster.stop_throttle()
        # A pod log read on the same connection pool, as a diagnosis does, gets the log and not that body.
        text = client.get_text(log_path, {"container": "nvidia-device-plugin-ctr"})
    assert "Starting NVIDIA Device Plugin" in text, text
    assert '"kind":"Status"' not in text


# 5. A server that throttles every watch: the timeout is judged on a fresh read of the pending nodes -------------


def test_nodes_that_reported_while_every_watch_was_throttled_are_not_blamed():
    # The plugin's capacity appears 1.5 s after the wait's first list; no watch ever gets through (429 each time),
    # so the wait sees no event. A fresh read at its deadline finds every node ready: the run passes, and says why.
    nodes = [SimNode("gpu-1", gpus=2), SimNode("gpu-2", gpus=4)]
    with SimCluster(nodes=nodes, capacity_delay=1.5) as cluster:
        cluster.throttle(share=1.0, retry_after=1, verbs=["watch"])
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2, "gpu-2": 4}, wait_timeout=4))
        watches = node_requests(cluster, verbs=("watch",))
    assert result.get("failed") is not True, result.get("msg")
    assert watches and all(status == 429 for _t, _v, status in watches), watches
    assert result["nodes"]["gpu-1"]["ready"] and result["nodes"]["gpu-2"]["ready"]
    warnings = [str((w.get("event") or {}).get("msg", "")) if isinstance(w, dict) else w for w in result["warnings"]]
    assert any("saw it only in a fresh read at its deadline" in w for w in warnings), warnings


def test_a_throttled_timeout_blames_only_the_node_that_still_has_no_gpus():
    nodes = [SimNode("gpu-1", gpus=2), SimNode("gpu-2", gpus=4, faults="never_reports")]
    with SimCluster(nodes=nodes, capacity_delay=1.5) as cluster:
        cluster.throttle(share=1.0, retry_after=1, verbs=["watch"])
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2, "gpu-2": 4}, wait_timeout=4))
    assert result["failed"] is True
    assert "1 of 2 nodes ready" in result["msg"], result["msg"]
    assert [line.split(":")[0] for line in result["diagnosis"]] == ["gpu-2"], result["diagnosis"]
    assert result["nodes"]["gpu-1"]["ready"] is True


def test_when_the_fresh_read_is_refused_too_the_message_says_the_states_are_old():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=1.5) as cluster:
        cluster.throttle(share=1.0, retry_after=1, verbs=["watch", "get"], path_regex="^/api/v1/nodes")
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2}, wait_timeout=3))
    assert result["failed"] is True
    assert (
        "as the API server last showed them: reading the pending nodes again at the timeout failed: 429"
        in (result["msg"])
    ), result["msg"]

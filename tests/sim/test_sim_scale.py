"""5,000 simulated nodes (Kubernetes' supported maximum): capacity updates must not stall the API."""

from __future__ import annotations

import json
import threading
import time

import pytest
import urllib3
from kubesim import CAPACITY_ANNOTATION, SimCluster, SimNode
from kubesim.resources import BY_PLURAL
from sim_objects import DAEMONSET

NODES = 5000


@pytest.mark.slow
def test_capacity_for_5000_nodes_streams_without_stalling_the_server() -> None:
    nodes = [SimNode(f"gpu-node-{i}", gpus=8) for i in range(1, NODES + 1)]
    with SimCluster(nodes, tls=False, capacity_delay=0.2, capacity_spread=2.0) as sim:
        http = urllib3.PoolManager(maxsize=4, retries=False)
        headers = {"Authorization": "Bearer test-token"}
        listed = json.loads(http.request("GET", f"{sim.url}/api/v1/nodes", headers=headers).data)
        assert len(listed["items"]) == NODES
        start_rv = listed["metadata"]["resourceVersion"]
        seen: set[str] = set()
        lags: list[float] = []

        def watch() -> None:
            answer = http.request(
                "GET",
                f"{sim.url}/api/v1/nodes?watch=1&resourceVersion={start_rv}&timeoutSeconds=60",
                headers=headers,
                preload_content=False,
            )
            buffer = b""
            for chunk in answer.stream(1 << 16):
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    node = json.loads(line)["object"]
                    if node["status"]["capacity"].get("nvidia.com/gpu") == "8" and node["metadata"]["name"] not in seen:
                        seen.add(node["metadata"]["name"])
                        lags.append(time.time() - float(node["metadata"]["annotations"][CAPACITY_ANNOTATION]))
                if len(seen) == NODES:
                    answer.release_conn()
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        sim.api.apply(BY_PLURAL["daemonsets"], "kube-system", DAEMONSET["metadata"]["name"], DAEMONSET, "t", True)
        slowest = 0.0
        while watcher.is_alive() and len(lags) < NODES:
            started = time.monotonic()
            answer = http.request("GET", f"{sim.url}/api/v1/nodes/gpu-node-4321", headers=headers)
            assert answer.status == 200
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.05)
        watcher.join(timeout=60)
        assert len(seen) == NODES
        times = sim.capacity_times()
        # Capacity was spread over the window rather than landing at once, and each update reached the watcher fast.
        assert max(times.values()) - min(times.values()) >= 1.5
        assert sorted(lags)[len(lags) // 2] < 1.0
        assert slowest < 3.0

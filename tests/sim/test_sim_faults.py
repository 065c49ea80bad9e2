"""The simulator's injected misbehaviour (kubesim/faults.py), read with plain urllib3 as any client would."""

from __future__ import annotations

import json
import time

import urllib3
from kubesim import SimCluster


def _pool(cluster: SimCluster) -> tuple[urllib3.PoolManager, dict[str, str]]:
    pool = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=cluster.ca_file)
    return pool, {"Authorization": f"Bearer {cluster.token}"}


def test_throttle_answers_a_share_of_requests_with_429_and_retry_after(cluster: SimCluster) -> None:
    pool, headers = _pool(cluster)
    cluster.throttle(share=0.5, retry_after=1, verbs=["list"])
    answers = [
        pool.request("GET", cluster.url + "/api/v1/nodes", headers=headers, retries=False) for _attempt in range(6)
    ]
    assert [a.status for a in answers] == [200, 429, 200, 429, 200, 429]
    throttled = answers[1]
    assert throttled.headers["Retry-After"] == "1"
    status = json.loads(throttled.data)
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 429, "TooManyRequests")
    # Other verbs pass; the request log has each request with its status.
    assert pool.request("GET", cluster.url + "/api/v1/nodes/gpu-1", headers=headers).status == 200
    assert [(verb, code) for _t, verb, _r, code in cluster.request_log()][-3:] == [
        ("list", 200),
        ("list", 429),
        ("get", 200),
    ]
    cluster.stop_throttle()
    assert pool.request("GET", cluster.url + "/api/v1/nodes", headers=headers).status == 200


def test_watch_modes(cluster: SimCluster) -> None:
    pool, headers = _pool(cluster)
    url = cluster.url + "/api/v1/nodes?watch=true&resourceVersion=1&timeoutSeconds=1"
    cluster.set_watch_mode("ends_at_once")
    started = time.monotonic()
    empty = pool.request("GET", url, headers=headers)
    assert (empty.status, empty.data) == (200, b"")
    assert time.monotonic() - started < 0.5

    cluster.set_watch_mode("bookmarks_only", interval=0.1, hold=2.0)
    started = time.monotonic()
    bookmarks = pool.request("GET", url, headers=headers)
    # timeoutSeconds=1 is ignored: the stream lasts its 2 s hold, with nothing but bookmarks.
    assert time.monotonic() - started >= 1.9
    events = [json.loads(line) for line in bookmarks.data.splitlines() if line.strip()]
    assert len(events) >= 10
    assert {event["type"] for event in events} == {"BOOKMARK"}

    cluster.set_watch_mode("trickle", interval=0.1, hold=0.5)
    trickle = pool.request("GET", url, headers=headers)
    assert trickle.data.strip() == b"" and trickle.data.count(b"\n") >= 3


def test_error_body_comes_after_the_status_line(cluster: SimCluster) -> None:
    pool, headers = _pool(cluster)
    cluster.set_error_body_delay(1.0)
    started = time.monotonic()
    missing = pool.request("GET", cluster.url + "/api/v1/nodes/nope", headers=headers, preload_content=False)
    assert missing.status == 404
    assert time.monotonic() - started < 0.9
    body = missing.read()
    assert time.monotonic() - started >= 1.0
    assert json.loads(body)["reason"] == "NotFound"

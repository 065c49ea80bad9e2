"""kubegpu.node.nvidia_device_plugin against a real cluster: opt-in, only when KUBECONFIG is set.

By default it only sends server-side dry runs (check mode), which change nothing. With KUBEGPU_REAL_APPLY=1 it also
applies the plugin into the namespace KUBEGPU_REAL_NAMESPACE (default kube-system), waits on the nodes named in
KUBEGPU_REAL_EXPECTED ("node=gpus,node=gpus"; all nodes the plugin would run on when unset) and removes it again.
"""

from __future__ import annotations

import os

import pytest
from nvidia_device_plugin_harness import run_module

pytestmark = [
    pytest.mark.real_cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set: no real cluster to test"),
]


def base_args():
    return {
        "kubeconfig": os.environ["KUBECONFIG"].split(os.pathsep)[0],
        "namespace": os.environ.get("KUBEGPU_REAL_NAMESPACE", "kube-system"),
        "runtime_class": True,
    }


def test_dry_run_is_accepted_by_the_real_api_server():
    result = run_module(
        dict(base_args(), config={"version": "v1", "flags": {"migStrategy": "none"}}), check_mode=True, diff=True
    )
    assert result.get("failed") is not True, result.get("msg")
    assert result["waited"] == 0
    assert {entry["kind"] for entry in result["objects"]} == {"RuntimeClass", "ConfigMap", "DaemonSet"}


def test_absent_dry_run():
    result = run_module(dict(base_args(), state="absent"), check_mode=True)
    assert result.get("failed") is not True, result.get("msg")


@pytest.mark.skipif(os.environ.get("KUBEGPU_REAL_APPLY") != "1", reason="KUBEGPU_REAL_APPLY=1 not set: dry runs only")
def test_apply_wait_and_remove():
    expected = os.environ.get("KUBEGPU_REAL_EXPECTED")
    args = dict(base_args(), wait_timeout=int(os.environ.get("KUBEGPU_REAL_TIMEOUT", "600")))
    if expected:
        args["expected_gpus"] = {k: int(v) for k, v in (item.split("=", 1) for item in expected.split(","))}
    try:
        result = run_module(args)
        assert result.get("failed") is not True, result.get("msg")
        assert all(node["ready"] for node in result["nodes"].values())
        again = run_module(args)
        assert again["changed"] is False
    finally:
        removed = run_module(dict(base_args(), state="absent"))
        assert removed.get("failed") is not True, removed.get("msg")

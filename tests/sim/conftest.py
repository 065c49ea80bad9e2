"""Fixtures for the simulator's own tests: a running SimCluster, a client for it, and kubectl."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from kubesim import SimCluster, SimNode
from sim_objects import DAEMONSET, PLUGIN_IMAGE, daemonset, server_side_apply  # noqa: F401 (re-exported)

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes Python client is not installed")
from kubernetes import client, config

REPO = TESTS_DIR.parent


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    nodes = [
        SimNode("gpu-1", gpus=8, labels={"nvidia.com/gpu.present": "true"}),
        SimNode(
            "gpu-2", gpus=4, labels={"nvidia.com/gpu.present": "true"}, taints=["nvidia.com/gpu=present:NoSchedule"]
        ),
        SimNode("cpu-1", gpus=0),
    ]
    with SimCluster(nodes=nodes, tls=True, token="test-token", capacity_delay=0.1) as sim:
        yield sim


@pytest.fixture
def kubeconfig(cluster: SimCluster, tmp_path: Path) -> str:
    return cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))


@pytest.fixture
def api_client(kubeconfig: str) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(kubeconfig)
    yield api
    api.close()


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def apps(api_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


@pytest.fixture
def kubectl() -> str:
    path = os.environ.get("KUBECTL") or str(REPO / ".tmp" / "bin" / "kubectl")
    if not os.access(path, os.X_OK):
        path = shutil.which("kubectl") or ""
    if not path:
        pytest.skip("kubectl is not installed: run `make kubectl` (Debian's kubectl into .tmp/bin)")
    return path

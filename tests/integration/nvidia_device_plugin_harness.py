"""Run kubegpu.node.nvidia_device_plugin in-process, as Ansible would, and read what it returned.

AnsibleModule reads its arguments from ansible-core's test hook and prints one JSON result before exiting; this
captures that output, so the tests see exactly what a playbook would.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any
from unittest import mock

import urllib3
from ansible.module_utils import _internal as _module_utils_internal
from ansible.module_utils.testing import patch_module_args
from ansible_collections.kubegpu.node.plugins.modules import nvidia_device_plugin


def run_module(
    args: dict[str, Any], check_mode: bool = False, diff: bool = False, module: Any = None
) -> dict[str, Any]:
    """Run a module of this collection (kubegpu.node.nvidia_device_plugin unless ``module`` names another's Python
    module) and return its result."""
    module_args = dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)
    output = io.StringIO()
    # Importing any controller code (a filter plugin's tests, say) flips ansible-core into controller mode, where
    # module warnings go to the display instead of the result; a module process never runs in that mode.
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(_module_utils_internal, "is_controller", False))
        stack.enter_context(patch_module_args(module_args))
        stack.enter_context(contextlib.redirect_stdout(output))
        stack.enter_context(contextlib.suppress(SystemExit))
        (module or nvidia_device_plugin).main()
    text = output.getvalue()
    try:
        return json.loads(text)
    except ValueError as error:
        raise AssertionError(f"module printed no JSON result: {text!r}") from error


def auth_args(cluster) -> dict[str, Any]:
    """Credentials for the simulated cluster, the way a user passes host, token and CA."""
    return {"host": cluster.url, "api_key": cluster.token, "ca_cert": cluster.ca_file}


class Api:
    """A plain HTTP reader of the simulated cluster, independent of the code under test."""

    def __init__(self, cluster):
        self.base = cluster.url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {cluster.token}", "Accept": "application/json"}
        kwargs = {"cert_reqs": "CERT_REQUIRED", "ca_certs": cluster.ca_file} if self.base.startswith("https") else {}
        self.pool = urllib3.PoolManager(**kwargs)

    def get(self, path: str):
        response = self.pool.request("GET", self.base + path, headers=self.headers)
        if response.status == 404:
            return None
        assert response.status == 200, (path, response.status, response.data[:300])
        return json.loads(response.data)


DAEMONSET = "/apis/apps/v1/namespaces/kube-system/daemonsets/nvidia-device-plugin-daemonset"
CONFIG_MAP = "/api/v1/namespaces/kube-system/configmaps/nvidia-device-plugin-config"
RUNTIME_CLASS = "/apis/node.k8s.io/v1/runtimeclasses/nvidia"

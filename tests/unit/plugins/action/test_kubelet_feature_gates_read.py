"""kubelet_feature_gates reads the node's files in one command; the lines it gets back end in "\r\n" over SSH with
become, where Ansible runs the command in a terminal (ssh -tt). The demo's kubelet plan on node 2 failed on it: every
provisioner marker read as present, so the kubelet's fix was refused as a kops node's."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from ansible_collections.kubegpu.node.plugins.action.kubelet_feature_gates import ActionModule


def _action(tmp_path, line_end: str) -> ActionModule:
    action = ActionModule.__new__(ActionModule)

    def command(argv: list[str]) -> dict[str, Any]:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tmp_path)
        return {"rc": done.returncode, "stdout": done.stdout.replace("\n", line_end), "stderr": done.stderr}

    action.command = command  # type: ignore[method-assign]
    return action


@pytest.mark.parametrize("line_end", ["\n", "\r\n"], ids=["pipe", "terminal"])
def test_missing_markers_and_files_read_as_missing_in_a_terminal_too(tmp_path, line_end):
    present = tmp_path / "kubeadm-flags.env"
    present.write_text('KUBELET_KUBEADM_ARGS="--feature-gates=DevicePlugins=true"\n')
    requests = [f"e:{tmp_path}/kube_env.yaml", f"e:{present}", f"r:{present}", f"r:{tmp_path}/missing"]
    found = _action(tmp_path, line_end)._node_read(requests)
    assert found == [None, b"", present.read_bytes(), None]

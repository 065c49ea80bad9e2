# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# The filters kubegpu.node.gpu_mig_strategy and kubegpu.node.gpu_mig_resources: which MIG strategy NVIDIA's device
# plugin needs for the nodes' MIG devices, and what each node must then advertise. Documentation: gpu_mig_strategy.yml
# and gpu_mig_resources.yml next to this file. Pure: the gpu_mig role reads the nodes, the device plugin module waits.

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.kubegpu.node.plugins.plugin_utils import _mig as mig


def _wants_mig(value: Any) -> bool:
    """A node's layout name (MIG on unless empty or all-disabled) or its MIG devices (a GPU with MIG enabled)."""
    if isinstance(value, dict):
        return bool(int(value.get("mig_enabled_gpus") or 0))
    return str(value or "") not in ("", "all-disabled")


def _by_node(devices_by_node: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(devices_by_node, dict) or not all(isinstance(v, dict) for v in devices_by_node.values()):
        raise AnsibleFilterError(
            "expects a mapping of node name to its MIG devices (the gpu_mig role's gpu_mig_devices: gpus, full_gpus, "
            "mig_enabled_gpus, mig)"
        )
    return {str(node): devices for node, devices in devices_by_node.items()}


def gpu_mig_strategy(nodes: Any, requested: Any = "auto") -> str:
    """The device plugin's MIG strategy: ``requested`` when it is none, single or mixed; for auto, mixed when a node
    wants MIG (mixed serves every layout, and GPUs without MIG beside them), else none.

    ``nodes``: the nodes' layout names (a list, or node -> name) or their MIG devices (node -> gpu_mig_devices).
    """
    requested = str(requested or "auto")
    if requested in mig.STRATEGIES:
        return requested
    if requested != "auto":
        raise AnsibleFilterError(f"the MIG strategy must be auto, none, single or mixed, not {requested!r}")
    if isinstance(nodes, dict):
        values = list(nodes.values())
    elif isinstance(nodes, (list, tuple)):
        values = list(nodes)
    else:
        raise AnsibleFilterError("gpu_mig_strategy expects the nodes' layout names or MIG devices (a list or a dict)")
    return "mixed" if any(_wants_mig(v) for v in values) else "none"


def gpu_mig_resources(devices_by_node: Any, strategy: Any) -> dict[str, dict[str, int]]:
    """Per node with a GPU in MIG mode, the resources the device plugin advertises there (before sharing), for the
    device plugin module's expected_resources. Nodes without MIG are left to its expected_gpus."""
    result: dict[str, dict[str, int]] = {}
    problems = []
    for node, devices in sorted(_by_node(devices_by_node).items()):
        if not int(devices.get("mig_enabled_gpus") or 0):
            continue
        try:
            result[node] = mig.expected_resources(devices, str(strategy))
        except mig.MigError as error:
            problems.append(f"{node}: {error}")
    if problems:
        raise AnsibleFilterError("; ".join(problems))
    return result


class FilterModule:
    """kubegpu.node MIG filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_mig_strategy": gpu_mig_strategy, "gpu_mig_resources": gpu_mig_resources}

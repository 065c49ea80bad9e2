# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.gpu_health: reads a GPU node once (nvidia-smi -q -x, the kernel log's Xid lines since boot,
# NVIDIA GPUs on the PCI bus) in one shell command, and judges it on the controller. It changes nothing on the node.
# Documentation: plugins/modules/gpu_health.py; the decisions: plugins/plugin_utils/_gpu_health.py.

from __future__ import annotations

from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _gpu_health as gh
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction

ARGUMENT_SPEC: dict[str, Any] = {
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
    "kernel_log_file": {"type": "str", "default": ""},
    "pci_devices_dir": {"type": "str", "default": "/sys/bus/pci/devices"},
    "max_xid_lines": {"type": "int", "default": 2000},
    "ignore_xids": {"type": "list", "elements": "int", "default": []},
    "facts_file": {"type": "path", "default": ""},
    "fail_on": {"type": "str", "default": "none"},
}


class ActionModule(NodeAction):
    argument_spec = ARGUMENT_SPEC
    failures = (gh.HealthReadError, ValueError)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        if args["max_xid_lines"] < 1:
            raise ValueError("max_xid_lines must be 1 or more")
        # The role's gpu_health_fail_on, refused before the node is read (the role's settings check).
        gh.fails({}, args["fail_on"])
        # One round trip, also in check mode: the read changes nothing.
        outcome = self.command(
            [
                "sh",
                "-c",
                gh.READ_SCRIPT,
                "gpu_health",
                args["nvidia_smi"],
                args["kernel_log_file"],
                args["pci_devices_dir"],
                str(args["max_xid_lines"]),
                args["facts_file"],
            ]
        )
        try:
            health, content, current = gh.judge_and_compare(outcome["stdout"], args["ignore_xids"])
        except gh.HealthReadError as exc:
            said = " ".join(outcome["stderr"].split())[:300]
            raise gh.HealthReadError(f"{exc} (exit {outcome['rc']}{': ' + said if said else ''})") from None
        result = {
            "changed": False,
            "gpu_health": health,
            "fails": gh.fails(health, args["fail_on"]),
            "msg": health["summary"],
        }
        if args["facts_file"]:
            result.update(facts_content=content, facts_current=current)
        return result

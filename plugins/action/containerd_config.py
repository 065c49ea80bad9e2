# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.containerd_config: plans containerd's files for the nvidia runtime on the controller
# (tomllib) and checks them with the node's own `containerd config dump`. It writes nothing containerd reads; the
# candidates it tries live in a temporary folder that the command making them removes. A run with nothing to change
# costs two commands on the node. Documentation: plugins/modules/containerd_config.py.

from __future__ import annotations

import os
from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _containerd_config as cc
from ansible_collections.kubegpu.node.plugins.plugin_utils import _containerd_node as cn
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError

ARGUMENT_SPEC: dict[str, Any] = {
    "path": {"type": "path", "default": "/etc/containerd/config.toml"},
    "dropin": {"type": "path", "default": "/etc/containerd/conf.d/99-nvidia.toml"},
    "record": {"type": "path", "required": True},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "runtime_name": {"type": "str", "default": "nvidia"},
    "runtime_path": {"type": "path", "default": "/usr/bin/nvidia-container-runtime"},
    "systemd_cgroup": {"type": "bool"},
    "set_as_default": {"type": "bool", "default": False},
    "cdi": {"type": "bool", "default": False},
    "cdi_spec_dirs": {"type": "list", "elements": "path", "default": ["/etc/cdi", "/var/run/cdi"]},
    "containerd_binary": {"type": "str", "default": "containerd"},
}


class ActionModule(NodeAction):
    # The node is read, and the candidates dumped, by commands (_containerd_node.SCRIPT): no temporary folder of
    # Ansible's unless a candidate is too large to travel inside a command.
    argument_spec = ARGUMENT_SPEC
    failures = (cc.ConfigError, NodeError)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        args["path"] = os.path.normpath(args["path"])
        node = cn.SnapshotNode(self.command, binary=args["containerd_binary"], put=self.put)
        return {**cc.Planner(node, args).plan(), "changed": False}

# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.containerd_config: plans containerd's files for the nvidia runtime on the controller
# (tomllib) and checks them with the node's own `containerd config dump`. It writes nothing containerd reads; the
# candidates it tries live in the task's temporary folder. Documentation: plugins/modules/containerd_config.py.

from __future__ import annotations

import os
from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _containerd_config as cc
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


class _Node:
    """kubegpu.node's Node interface over the action's connection."""

    def __init__(self, action: NodeAction) -> None:
        self.action = action

    def read(self, path: str) -> str | None:
        try:
            data = self.action.read_bytes(path)
        except NodeError as exc:
            raise cc.ConfigError(str(exc)) from None
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise cc.ConfigError(
                f"{path} is not UTF-8 text (containerd's TOML must be); it was left untouched"
            ) from None

    def run(self, argv: list[str]) -> str:
        outcome = self.action.command(argv)
        if outcome["rc"] != 0:
            said = (outcome["stderr"] or outcome["stdout"]).strip()
            raise cc.ConfigError(f"'{' '.join(argv)}' failed (rc {outcome['rc']}): {said}")
        return outcome["stdout"]

    def put(self, name: str, text: str) -> str:
        return self.action.put(name, text)

    def glob(self, pattern: str) -> list[str]:
        parts = pattern.split("/")
        fixed = next(i for i, part in enumerate(parts) if "*" in part)
        root = "/".join(parts[:fixed]) or "/"
        depth = len(parts) - fixed
        try:
            found = self.action.module(
                "ansible.legacy.find",
                {
                    "paths": [root],
                    "patterns": [parts[-1]],
                    "file_type": "any",
                    "recurse": depth > 1,
                    "depth": depth,
                },
            )
        except NodeError as exc:
            raise cc.ConfigError(f"cannot list {pattern}: {exc}") from None
        return sorted(f["path"] for f in found.get("files", []) if cc.pattern_matches(pattern, f["path"]))

    def mode(self, path: str) -> str | None:
        stat = self.action.stat(path)
        return stat.get("mode") if stat.get("exists") else None


class ActionModule(NodeAction):
    argument_spec = ARGUMENT_SPEC
    failures = (cc.ConfigError, NodeError)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        args["path"] = os.path.normpath(args["path"])
        return {**cc.Planner(_Node(self), args).plan(), "changed": False}

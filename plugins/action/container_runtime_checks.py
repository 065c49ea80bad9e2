# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.container_runtime_checks (internal to the role kubegpu.node.container_runtime): in one task,
# the role's checks before anything changes - which runtimes are installed and which to configure (or, in the run
# after the preflight, what the preflight found), then the refusals. One command on the node, none when there is
# nothing to read. Documentation: plugins/modules/container_runtime_checks.py; decisions:
# plugins/plugin_utils/_container_runtime_checks.py.

from __future__ import annotations

from datetime import datetime
from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _chain_plan as cp
from ansible_collections.kubegpu.node.plugins.plugin_utils import _container_runtime_checks as rc
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError, command_error

ARGUMENT_SPEC: dict[str, Any] = {
    "state": {"type": "str", "required": True, "choices": ["present", "absent"]},
    "engines": {"type": "list", "elements": "str", "default": []},
    "require_nvidia_runtime": {"type": "bool", "default": True},
    "nvidia_runtime_path": {"type": "str", "required": True},
    "binaries": {"type": "dict", "required": True},
    "hand_over": {"type": "bool", "default": False},
    "found": {"type": "dict", "default": {}},
    # Handed over with the findings (hand_over): what else site.yml's batch needs to read the runtime's configuration
    # again as the role would (kubegpu.node.chain_plan).
    "replay": {"type": "dict", "default": {}},
}


class Refused(Exception):
    """The checks refuse the run: its text is the task's failure message."""


class ActionModule(NodeAction):
    argument_spec = ARGUMENT_SPEC
    failures = (Refused, NodeError)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        host = str(self._vars.get("inventory_hostname", "the node"))
        state, given = args["state"], args["engines"]
        binaries = {str(engine): str(binary) for engine, binary in args["binaries"].items()}
        nvidia_path = args["nvidia_runtime_path"] if rc.nvidia_required(state, args["require_nvidia_runtime"]) else ""
        previous = args["found"] or {}

        if not args["hand_over"] and rc.takes_over(previous, given, state):
            # The preflight searched in this run already; nvidia-container-runtime may have come since (the toolkit).
            installed, engines = list(previous["installed"]), list(previous["engines"])
            start, searched = str(previous.get("start", "")), False
            nvidia_ok = self._read(rc.nvidia_argv(nvidia_path), {}).nvidia_runtime_ok if nvidia_path else None
        else:
            start, searched = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f"), True
            dump = binaries.get("containerd", "") if not given else ""
            read = self._read(rc.node_argv(binaries, dump, nvidia_path), binaries)
            installed = list(read.installed)
            engines = rc.engines_to_configure(given, installed, rc.cri_disabled(read.disabled_plugins))
            nvidia_ok = read.nvidia_runtime_ok

        refusals = rc.problems(
            host, state, engines, installed, args["require_nvidia_runtime"], args["nvidia_runtime_path"], nvidia_ok
        )
        if refusals:
            raise Refused(" ".join(refusals))
        return {
            "changed": False,
            "installed": installed,
            "engines": engines,
            "searched": searched,
            "start": start,
            # Used once: the role's next run takes it over, and its own result offers none.
            "handover": rc.hand_over(given, state) if args["hand_over"] else {},
            **({"replay": cp.replay(args, **args["replay"])} if args["hand_over"] and args["replay"] else {}),
        }

    def _read(self, argv: list[str], binaries: dict[str, str]) -> rc.NodeRead:
        said = self.command(self._with_task_environment(argv))
        if said["rc"] != 0:
            raise NodeError(f"searching for the container runtimes failed (rc {said['rc']}): {command_error(said)}")
        try:
            return rc.parse_node(said["stdout"], binaries)
        except rc.NodeAnswerError as exc:
            raise NodeError(str(exc)) from None

    def _with_task_environment(self, argv: list[str]) -> list[str]:
        """The argv under the task's `environment` (a PATH, say), as a module would run with it."""
        environment: dict[str, Any] = {}
        self._compute_environment_string(environment)
        if not environment:
            return argv
        return ["env", *(f"{name}={value}" for name, value in environment.items()), *argv]

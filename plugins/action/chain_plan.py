# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.chain_plan (internal to the playbook kubegpu.node.site): at the start of a host's batch, in
# one task, which steps of the role chain have anything to do, each read again as its role's batch run would read it
# (the role's own read-only actions, from what this run's preflight handed over). Documentation:
# plugins/modules/chain_plan.py; decisions: plugins/plugin_utils/_chain_plan.py.

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible_collections.kubegpu.node.plugins.plugin_utils import _chain_plan as cp
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction

ARGUMENT_SPEC: dict[str, Any] = {
    "steps": {"type": "list", "elements": "str", "required": True},
    "plans": {"type": "dict", "default": {}},
    "require_nvidia_runtime": {"type": "bool", "default": True},
}


class ActionModule(NodeAction):
    argument_spec = ARGUMENT_SPEC
    failures = (ValueError,)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        plans = {str(step): dict(plan or {}) for step, plan in args["plans"].items()}
        decided = cp.decide(list(args["steps"]), plans, args["require_nvidia_runtime"], self._read)
        return {"changed": False, **decided}

    def _read(self, name: str, args: dict[str, Any], check_mode: bool) -> dict[str, Any]:
        """Run one of the collection's read-only actions on this host (check_mode: as a check run would), as a task of
        its own would, and return its result. Its warnings were given by the preflight's run of the same read. Any
        error of the read is its failure (the step then runs, and its role's own run reports it); a lost connection is
        the host's (unreachable), as for any task."""
        task = self._task.copy()
        task.args = args
        if check_mode:
            task.check_mode = True
        action = self._shared_loader_obj.action_loader.get(
            name,
            task=task,
            connection=self._connection,
            play_context=self._play_context,
            loader=self._loader,
            templar=self._templar,
            shared_loader_obj=self._shared_loader_obj,
        )
        if action is None:
            # This collection's own action missing is a broken installation, not a step with work: said, not hidden.
            raise AnsibleError(f"kubegpu.node.chain_plan cannot find the action {name}")
        try:
            result = dict(action.run(task_vars=self._vars))
        except AnsibleConnectionFailure:
            raise
        except Exception as exc:  # pylint: disable=broad-exception-caught  # the step runs; its role says why
            return {"failed": True, "msg": f"{type(exc).__name__}: {exc}"}
        result.pop("warnings", None)
        result.pop("deprecations", None)
        return result

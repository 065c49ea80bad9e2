# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.node_layer (internal to roles/_common): in one task, what every role of this collection
# starts its preflight with - refuse a caller that is not one of its roles, check the node's Python (once a run and
# interpreter, without a module), gather the facts the roles read (once), find the calling role's OS variable files
# (once a run and role) and decide the renamed variables. Documentation: plugins/modules/node_layer.py; decisions:
# plugins/plugin_utils/_node_layer.py.

from __future__ import annotations

import os
from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _node_layer as nl
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError

ARGUMENT_SPEC: dict[str, Any] = {
    "caller": {"type": "str", "default": ""},
    "caller_path": {"type": "path", "default": ""},
    "interpreter": {"type": "str", "default": "python3"},
    "done": {"type": "dict", "default": {}},
    "renamed": {"type": "list", "elements": "dict", "default": []},
    "given": {"type": "dict", "default": {}},
    "renames_applied": {"type": "bool", "default": False},
}


class Refused(Exception):
    """The layer refuses: its text is the task's failure message."""


class ActionModule(NodeAction):
    argument_spec = ARGUMENT_SPEC
    failures = (Refused, NodeError)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        caller = args["caller"]
        refused = nl.refusal(caller, args["caller_path"], str(self._vars.get("role_path", "")))
        if refused:
            raise Refused(refused)
        refused = nl.renames_refusal(caller, args["renamed"], args["renames_applied"])
        if refused:
            raise Refused(refused)
        done = args["done"] or {}
        interpreter = args["interpreter"]
        out: dict[str, Any] = {"changed": False, "caller": caller}
        warnings: list[str] = []

        # Before any module runs: a module on an older Python fails with an error that does not say so.
        if done.get("python_checked") != interpreter:
            said = self.command(nl.python_argv(interpreter))
            refused = nl.python_refusal(
                str(self._vars.get("inventory_hostname", "the node")),
                caller,
                int(said["rc"] if said["rc"] is not None else 1),
                said["stdout"],
                said["stderr"],
            )
            if refused:
                raise Refused(refused)
        out["python_checked"] = interpreter

        facts = dict(self._vars.get("ansible_facts") or {})
        if nl.missing_facts(facts):
            gathered = self.module("ansible.legacy.setup", {"gather_subset": ["min"]})
            out["ansible_facts"] = gathered.get("ansible_facts", {})
            facts.update({key.removeprefix("ansible_"): value for key, value in out["ansible_facts"].items()})

        # A role's OS variables are loaded once a run: include_vars' variables last for the whole playbook run.
        loaded = [str(name) for name in done.get("loaded", [])]
        first = caller not in loaded
        out["os_files"] = []
        out["renamed"] = []
        if args["caller_path"] and first:
            out["os_files"] = nl.os_files(os.path.join(args["caller_path"], "vars", "os"), facts)
            tested_variable = f"__{nl.short_name(caller)}_os_tested"
            tested = True
            for path in out["os_files"]:
                loaded_vars = self._loader.load_from_file(path) or {}
                tested = bool(loaded_vars.get(tested_variable, tested))
            if not tested:
                warnings.append(nl.untested_note(facts, caller))
        if first:
            # The new names are set with set_fact, which also lasts for the run: once a run and role too.
            out["renamed"], messages = nl.renamed(args["renamed"], args["given"], caller)
            warnings.extend(messages)
            loaded.append(caller)
        out["loaded"] = loaded
        if warnings:
            out["warnings"] = warnings
        return out

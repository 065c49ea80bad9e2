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
    "renames_applied": {"type": "bool", "default": False},
    # The playbook kubegpu.node.site: the layer of these roles of this collection, in one call (nl.SITE).
    "roles": {"type": "list", "elements": "str", "default": []},
    "fact_path": {"type": "str", "default": ""},
    # Gather the facts once in the run even when some are known (a fact cache, AWX's fact storage: the node may have
    # changed since, its local facts too).
    "gather": {"type": "bool", "default": False},
}

# This collection's roles folder, beside its plugins folder.
OWN_ROLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")


class Refused(Exception):
    """The layer refuses: its text is the task's failure message."""


class ActionModule(NodeAction):
    argument_spec = ARGUMENT_SPEC
    failures = (Refused, NodeError)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        caller = args["caller"]
        if args["roles"] or caller == nl.SITE:
            refused = nl.site_refusal(caller, args["roles"], OWN_ROLES)
        else:
            refused = nl.refusal(caller, args["caller_path"], str(self._vars.get("role_path", "")))
        if refused:
            raise Refused(refused)
        if args["roles"]:
            # The site's one call for all its roles: each role's files and renamed variables, as its own call would
            # find them (its folder in this collection, its table of renamed variables in its vars/main.yml).
            callers = [(nl.COLLECTION_PREFIX + role, os.path.join(OWN_ROLES, role)) for role in args["roles"]]
        else:
            callers = [(caller, args["caller_path"])] if args["caller_path"] else []
        tables = {name: self._renamed_table(name, path) for name, path in callers}
        refused = nl.renames_refusal(caller, [] if args["roles"] else tables.get(caller, []), args["renames_applied"])
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
        out["gathered"] = bool(done.get("gathered"))
        if (args["gather"] and not out["gathered"]) or nl.missing_facts(facts):
            out["gathered"] = True
            setup: dict[str, Any] = {"gather_subset": ["min"]}
            if args["fact_path"]:
                setup["fact_path"] = args["fact_path"]
            gathered = self.module("ansible.legacy.setup", setup)
            out["ansible_facts"] = gathered.get("ansible_facts", {})
            facts.update({key.removeprefix("ansible_"): value for key, value in out["ansible_facts"].items()})

        # A role's OS variables are loaded once a run: include_vars' variables last for the whole playbook run.
        loaded = [str(name) for name in done.get("loaded", [])]
        out["os_files"] = []
        out["renamed"] = []
        for name, path in callers:
            if name in loaded:
                continue
            files = nl.os_files(os.path.join(path, "vars", "os"), facts)
            out["os_files"].extend(files)
            tested_variable = f"__{nl.short_name(name)}_os_tested"
            tested = True
            for file in files:
                loaded_vars = self._loader.load_from_file(file) or {}
                tested = bool(loaded_vars.get(tested_variable, tested))
            if not tested:
                warnings.append(nl.untested_note(facts, name))
            # The new names are set with set_fact, which also lasts for the run: once a run and role too.
            used, messages = nl.renamed(tables[name], self._given(tables[name]), name)
            out["renamed"].extend(used)
            warnings.extend(messages)
            loaded.append(name)
        out["loaded"] = loaded
        if warnings:
            out["warnings"] = warnings
        return out

    def _renamed_table(self, role: str, path: str) -> list[dict[str, Any]]:
        """A role's table of renamed variables: `__<role>_renamed` in its vars/main.yml ({old, new, type, removed_in},
        docs/naming.md), read from the file for a role's own call and the site's alike."""
        main = os.path.join(path, "vars", "main.yml")
        role_vars = (self._loader.load_from_file(main) or {}) if os.path.isfile(main) else {}
        return list(role_vars.get(f"__{nl.short_name(role)}_renamed") or [])

    def _given(self, table: list[dict[str, Any]]) -> dict[str, Any]:
        """The old names of `table` that are set for the host, with their values."""
        olds = [str(row["old"]) for row in table]
        return {old: self._templar.template(self._vars[old]) for old in olds if old in self._vars}

# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.gpu_validation: the decisions of kubegpu.node.site's GPU validation, on the controller (the
# logic is plugins/plugin_utils/_gpu_validation.py); playbooks/tasks/validate_cluster.yml orders the steps and makes
# the API calls with kubernetes.core. Documentation: plugins/modules/gpu_validation.py.

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from typing import Any

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.loader import lookup_loader
from ansible.utils.display import Display
from ansible_collections.kubegpu.node.plugins.plugin_utils import _gpu_validation as gv
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction

display = Display()

ARGUMENT_SPEC: dict[str, Any] = {
    "step": {"type": "str", "required": True, "choices": ["targets", "select", "plan", "wait", "rows"]},
    "hosts": {"type": "list", "elements": "str", "default": []},
    "nodes": {"type": "list", "elements": "dict", "default": []},
    "pods": {"type": "list", "elements": "dict", "default": []},
    "pods_after": {"type": "list", "elements": "dict", "default": []},
    "plugin_changed": {"type": "bool", "default": False},
    "awx_job_id": {"type": "raw"},
    "selection": {"type": "dict", "default": {}},
    "plan": {"type": "dict", "default": {}},
    "run": {"type": "str"},
    "namespace": {"type": "str", "default": "kubegpu-validation"},
    "image": {"type": "str"},
    "runtime_class": {"type": "str"},
    "timeout": {"type": "int", "default": 300},
    "check": {"type": "str", "choices": list(gv.CHECKS)},
    "wait_for": {"type": "list", "elements": "str", "default": []},
    "kubeconfig": {"type": "raw"},
    "context": {"type": "str"},
    "waits": {"type": "dict", "default": {}},
    "logs": {"type": "list", "elements": "dict", "default": []},
    "failed_task": {"type": "str"},
    "failed_result": {"type": "dict"},
}
# How often a wait reads the run's pods, and how many reads in a row may fail before it gives up.
POLL_SECONDS = 2.0
READ_FAILURES_ALLOWED = 3


def wait_for_pods(
    read: Callable[[], list[dict[str, Any]]],
    check: str,
    nodes: list[str],
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: float = POLL_SECONDS,
) -> dict[str, Any]:
    """Read the run's pods of ``check`` until each node's is settled (gv.settled) or ``timeout`` passes. Never fails
    for a timeout: what was seen is judged per node afterwards. Returns the pods as last seen, ``waited``, the nodes
    still unsettled and, when reading failed ``READ_FAILURES_ALLOWED`` times in a row, ``error``."""
    start = clock()
    deadline = start + timeout
    pods: list[dict[str, Any]] = []
    failures = 0
    error = None
    read_once = False
    while True:
        try:
            pods = read()
            read_once = True
            failures = 0
        except AnsibleError as exc:
            failures += 1
            error = f"reading the {check} pods failed: {to_text(exc.message if hasattr(exc, 'message') else exc)}"
            if failures >= READ_FAILURES_ALLOWED:
                break
        else:
            error = None
            if not gv.unsettled(check, nodes, pods):
                break
        if clock() + poll > deadline:
            break
        sleep(poll)
    return {
        "pods": pods,
        "waited": round(clock() - start, 1),
        # Pods never read are not known to be settled (a pod read and then gone is: it is judged as deleted).
        "unsettled": gv.unsettled(check, nodes, pods) if read_once else list(nodes),
        "error": error,
    }


class ActionModule(NodeAction):
    # Runs on the controller over what the play read from the API and the hosts: no connection.
    _requires_connection = False
    argument_spec = ARGUMENT_SPEC
    failures = (gv.ValidationError,)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"changed": False, **getattr(self, f"_{args['step']}")(args)}

    # ----- what the hosts hold ------------------------------------------------------------------------------

    def _host_vars(self, hosts: list[str]) -> dict[str, Mapping[str, Any]]:
        hostvars = self._vars.get("hostvars") or {}
        return {host: hostvars[host] for host in hosts if host in hostvars}

    def _targets_of(self, hosts: list[str]) -> list[gv.Target]:
        values = self._host_vars(hosts)
        collected = gv.collect_targets(hosts, values)
        known, modes = collected["expected"], collected["modes"]
        targets = []
        for host in hosts:
            own = values.get(host) or {}
            node = str(own.get("kubegpu_node_name") or host)
            local = (own.get("ansible_local") or {}) if isinstance(own.get("ansible_local"), Mapping) else {}
            toolkit = own.get("__kubegpu_toolkit_read") or {}
            versions = {
                "driver": gv.driver_version(local.get("nvidia")),
                "toolkit": gv.toolkit_version(toolkit.get("stdout") if isinstance(toolkit, Mapping) else ""),
            }
            targets.append(
                gv.Target(host, node, known.get(node), gv.host_changes(own), versions, modes.get(host, "none"))
            )
        return targets

    # ----- the steps ----------------------------------------------------------------------------------------

    def _targets(self, args: dict[str, Any]) -> dict[str, Any]:
        collected = gv.collect_targets(args["hosts"], self._host_vars(args["hosts"]))
        if collected["validating"]:
            try:
                gv.namespace_object(args["namespace"])
            except gv.ValidationError as exc:
                collected["problems"].append(f"{exc}.")
        for note in collected["deprecation_notes"]:
            display.deprecated(note, version="1.0.0", collection_name="kubegpu.node")
        return collected

    def _select(self, args: dict[str, Any]) -> dict[str, Any]:
        nodes = {n["metadata"]["name"]: n for n in args["nodes"] if (n.get("metadata") or {}).get("name")}
        selection = gv.select_nodes(self._targets_of(args["hosts"]), nodes, args["plugin_changed"])
        return {
            "run": args["run"] or gv.run_id(args["awx_job_id"]),
            "summary": gv.selection_summary(selection),
            **selection,
        }

    def _settings(self, args: dict[str, Any]) -> gv.Settings:
        if not args["run"] or not args["image"]:
            raise gv.ValidationError("the plan step needs run and image")
        return gv.Settings(args["namespace"], args["run"], args["image"], args["timeout"], args["runtime_class"])

    def _plan(self, args: dict[str, Any]) -> dict[str, Any]:
        nodes = {n["metadata"]["name"]: n for n in args["nodes"] if (n.get("metadata") or {}).get("name")}
        validate = list((args["selection"].get("validate") or {}).keys())
        planned = gv.plan(validate, nodes, args["pods"], self._settings(args))
        planned["namespace_object"] = gv.namespace_object(args["namespace"])
        planned["priority_class_object"] = gv.priority_class_object()
        planned["checked"] = [n for n in validate if n in planned["usage"] and n not in planned["busy"]]
        return planned

    def _wait(self, args: dict[str, Any]) -> dict[str, Any]:
        check, run = args["check"], args["run"]
        if not check or not run:
            raise gv.ValidationError("the wait step needs check and run")
        lookup = lookup_loader.get("kubernetes.core.k8s", loader=self._loader, templar=self._templar)
        options = {
            "kind": "Pod",
            "namespace": args["namespace"],
            "label_selector": f"{gv.RUN_LABEL}={run},{gv.CHECK_LABEL}={check}",
        }
        if args["kubeconfig"]:
            options["kubeconfig"] = args["kubeconfig"]
        if args["context"]:
            options["context"] = args["context"]

        def read() -> list[dict[str, Any]]:
            found = lookup.run([], variables=self._vars, **options)
            return [item for item in found if isinstance(item, dict)]

        waited = wait_for_pods(read, check, args["wait_for"], float(args["timeout"]))
        if waited["unsettled"]:
            display.vvv(f"GPU validation: {check} pods still waiting on {', '.join(waited['unsettled'])}")
        return waited

    def _rows(self, args: dict[str, Any]) -> dict[str, Any]:
        hosts = args["hosts"]
        targets = self._targets_of(hosts)
        values = self._host_vars(hosts)
        nodes = {n["metadata"]["name"]: n for n in args["nodes"] if (n.get("metadata") or {}).get("name")}
        node_checks = {}
        for target in targets:
            own = values.get(target.host) or {}
            host_result = own.get("__kubegpu_host_smi")
            container_result = own.get("__kubegpu_container_smi")
            if host_result is None and container_result is None:
                continue
            node_checks[target.host] = {
                "host": gv.host_cell(host_result if isinstance(host_result, Mapping) else None, target.expected),
                "container": gv.container_cell(container_result if isinstance(container_result, Mapping) else None),
            }
        # A wait that did not run (skipped, or never reached) left no pods.
        waits = {k: w for k, w in (args["waits"] or {}).items() if isinstance(w, Mapping) and "pods" in w}
        errors = [str(w["error"]) for w in waits.values() if w.get("error")]
        if args["failed_task"] or args["failed_result"]:
            errors.insert(0, gv.failure_text(args["failed_task"], args["failed_result"]))
        error = "; ".join(errors) or None
        logs = {}
        for entry in args["logs"]:
            pod = entry.get("item") or {}
            node = ((pod.get("metadata") or {}).get("annotations") or {}).get(gv.NODE_ANNOTATION)
            if node:
                logs[node] = [str(line) for line in entry.get("log_lines") or []]
        plan = args["plan"] if "usage" in (args["plan"] or {}) else {}
        pods_after = args["pods_after"]
        after = (
            {
                node: gv.gpu_usage(nodes.get(node), pods_after, exclude_run=args["run"])
                for node in (plan.get("usage") or {})
            }
            if pods_after
            else {}
        )
        outcome = gv.Outcome(
            plan=plan,
            pods={check: list((waits.get(check) or {}).get("pods") or []) for check in gv.CHECKS},
            logs=logs,
            after=after,
            waited={check: float((waits.get(check) or {}).get("waited") or 0.0) for check in gv.CHECKS},
            reached={check: check in waits for check in gv.CHECKS},
            error=error,
            check_mode=bool(self._play_context.check_mode),
        )
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        judged = gv.rows(targets, args["selection"], nodes, node_checks, outcome, args["run"] or "", when)
        judged["columns"] = ["node", "gpus", "host", "container", "pod", "scheduling"]
        # GPU health (site.yml's tasks/gpu_health.yml, gpu_health_result): shown per node, never a validation failure.
        health = {t.node: (values.get(t.host) or {}).get("gpu_health_result") for t in targets}
        if any(isinstance(h, Mapping) for h in health.values()):
            for row in judged["rows"]:
                verdict = health.get(row["node"])
                row["health"] = str(verdict.get("brief") or "") if isinstance(verdict, Mapping) else "not checked"
            judged["columns"].append("health")
        judged["table"] = gv.table(judged["rows"], judged["columns"])
        failed = judged["failed_nodes"]
        judged["message"] = gv.failure_message(failed, error) if (failed or error) else ""
        return judged

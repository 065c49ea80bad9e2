# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.gpu_health_node and kubegpu.node.dcgm_exporter: the modules' flows. They share the device
# plugin module's connection (credentials, retries of 429/5xx with Retry-After) and its server-side apply with the
# before/after diff (kubegpu.node.nvidia_device_plugin, plugins/module_utils/device_plugin/), so that the three modules
# authenticate, retry, report changes and run in check mode the same way.

from __future__ import annotations

import time

from ansible.module_utils.basic import missing_required_lib
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.apply import (
    APPLY_CONTENT_TYPE,
    apply_object,
    delete_object,
    diff_entry,
    summary,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import kubeconfig_secrets
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.client import (
    HAS_KUBERNETES,
    KUBERNETES_IMPORT_ERROR,
    KubeClient,
    load_configuration,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.errors import (
    DevicePluginError,
    KubeApiError,
)
from ansible_collections.kubegpu.node.plugins.module_utils.gpu_health import exporter, marks

JSON_PATCH = "application/json-patch+json"
TAINT_ATTEMPTS = 5
POLL_SECONDS = 2.0


def _connect(module, retry_window: float) -> KubeClient:
    if isinstance(module.params.get("kubeconfig"), dict):
        module.no_log_values.update(kubeconfig_secrets(module.params["kubeconfig"]))
    if not HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=str(KUBERNETES_IMPORT_ERROR))
    configuration, _source = load_configuration(module.params)
    if not configuration.verify_ssl:
        module.warn(
            "TLS certificate verification of the API server is disabled (validate_certs=false or an insecure "
            "kubeconfig): the connection can be intercepted; set ca_cert instead"
        )
    return KubeClient(configuration, retry_window=retry_window)


def _run(module, flow, retry_window: float = 60.0) -> None:
    result: dict = {"changed": False}
    client = None
    try:
        client = _connect(module, retry_window)
        flow(module, client, result)
    except DevicePluginError as error:
        result.update(error.details)
        if client is not None:
            result["api_requests"] = client.request_count
        module.fail_json(msg=error.msg, **result)
    result["api_requests"] = client.request_count
    module.exit_json(**result)


# ----- kubegpu.node.gpu_health_node -----------------------------------------------------------------------------


def run_marks(module) -> None:
    problems = marks.verdict_problems(module.params["verdict"])
    if problems:
        module.fail_json(msg="invalid verdict: " + "; ".join(problems), option_errors=problems)
    _run(module, _marks)


def _query(manager: str, dry_run: bool, **extra) -> dict:
    query = {"fieldManager": manager, **extra}
    if dry_run:
        query["dryRun"] = "All"
    return query


def _marks(module, client: KubeClient, result: dict) -> None:
    params = module.params
    name = params["name"]
    path = f"/api/v1/nodes/{name}"
    before = client.get_or_none(path)
    if before is None:
        raise DevicePluginError(f"node {name} is not in the cluster (check the name, or kubegpu_node_name)")
    wanted = marks.wanted_marks(params["verdict"], params["taint"])
    manager = params["field_manager"]
    dry_run = module.check_mode
    # 1. Labels and annotation: server-side apply, ours only; force takes over our own keys if someone set them.
    labelled = client.request(
        "PATCH",
        path,
        query=_query(manager, dry_run, force="true"),
        body=marks.apply_body(name, wanted),
        content_type=APPLY_CONTENT_TYPE,
    )
    node = labelled
    # 2. The taint: the atomic list, changed only as read (a JSON patch that tests it first), planned again from a
    #    fresh read when another writer changed it in between.
    for attempt in range(1, TAINT_ATTEMPTS + 1):
        new = marks.planned_taints((node.get("spec") or {}).get("taints"), wanted["taint"])
        if new is None:
            break
        patch = marks.taint_patch(node, new)
        try:
            node = client.request("PATCH", path, query=_query(manager, dry_run), body=patch, content_type=JSON_PATCH)
            break
        except KubeApiError as error:
            if error.status not in (409, 422) or attempt == TAINT_ATTEMPTS:
                raise
            fresh = client.request("GET", path)
            if marks.taint_patch(fresh, new) == patch:
                raise  # nothing changed in between: the patch itself was refused
            node = fresh
    # In check mode each dry run answers from the stored object: the labels as the apply would leave them, the taints
    # as the patch would.
    before_view = marks.marks_view(before)
    after_view = {**marks.marks_view(node), **{k: v for k, v in marks.marks_view(labelled).items() if "taint" not in k}}
    result["changed"] = before_view != after_view
    result.update(node=name, marks=after_view, verdict=params["verdict"].get("verdict"))
    if module._diff:
        result["diff"] = {
            "before_header": f"Node {name}",
            "after_header": f"Node {name}",
            "before": before_view,
            "after": after_view,
        }


# ----- kubegpu.node.dcgm_exporter -------------------------------------------------------------------------------


def run_exporter(module) -> None:
    problems = exporter_option_problems(module.params)
    if problems:
        module.fail_json(msg="invalid options: " + "; ".join(problems), option_errors=problems)
    _run(module, _exporter, retry_window=float(module.params["wait_timeout"]))


def exporter_option_problems(params: dict) -> list:
    problems = []
    if not 1 <= int(params["port"]) <= 65535:
        problems.append(f"port: {params['port']} is not a TCP port")
    if params["wait_timeout"] <= 0:
        problems.append(f"wait_timeout: must be a positive number of seconds, not {params['wait_timeout']}")
    if params.get("image") and (params.get("version") or params.get("registry")):
        problems.append("image: give either image, or registry and version")
    for key, value in (params.get("node_selector") or {}).items():
        if not isinstance(value, str):
            problems.append(f"node_selector[{key}]: label values must be strings, not {value!r}")
    if params.get("nodes") is not None and not params["nodes"]:
        problems.append("nodes: must name at least one node (or leave it out)")
    return problems


def _service_monitor_api(client: KubeClient) -> bool:
    """Whether the Prometheus Operator's ServiceMonitor CRD is installed (its API is in discovery)."""
    listing = client.get_or_none("/apis/monitoring.coreos.com/v1")
    return any(r.get("name") == "servicemonitors" for r in (listing or {}).get("resources") or [])


def _exporter(module, client: KubeClient, result: dict) -> None:
    params = module.params
    dry_run = module.check_mode
    crd = _service_monitor_api(client)
    want_monitor = params["service_monitor"] == "true" or (params["service_monitor"] == "auto" and crd)
    if params["service_monitor"] == "true" and not crd:
        raise DevicePluginError(
            "service_monitor is true but the cluster has no ServiceMonitor API (monitoring.coreos.com/v1): install "
            "the Prometheus Operator's CRDs, or set service_monitor to auto or false"
        )
    entries = []
    if params["state"] == "present":
        objects = [exporter.render_daemonset(params)]
        if params["service"] or want_monitor:
            objects.append(exporter.render_service(params))
        if want_monitor:
            objects.append(exporter.render_service_monitor(params))
        for obj in objects:
            entries.append(
                apply_object(
                    client,
                    obj,
                    params["field_manager"],
                    params["force_conflicts"],
                    dry_run,
                    path=exporter.object_path(obj),
                )
            )
        # What was turned off goes (only objects this collection made).
        gone = [] if (params["service"] or want_monitor) else ["Service"]
        if crd and not want_monitor:
            gone.append("ServiceMonitor")
    else:
        gone = ["DaemonSet", "Service"] + (["ServiceMonitor"] if crd else [])
    for kind in gone:
        target = exporter.removal_target(kind, params)
        entry = delete_object(client, target, dry_run, path=exporter.object_path(target))
        if entry.get("warning"):
            module.warn(entry["warning"])
        entries.append(entry)
    result["changed"] = any(e["changed"] for e in entries)
    result["objects"] = [summary(e) for e in entries if e.get("action") != "absent"]
    result["service_monitor"] = want_monitor
    if module._diff:
        result["diff"] = [diff_entry(e) for e in entries if e["changed"]]
    if params["state"] != "present" or dry_run or not params["wait"]:
        return
    daemonset = entries[0]["object"]
    outcome = wait_for_exporter(client, params, daemonset, float(params["wait_timeout"]))
    result["nodes"] = outcome["states"]
    result["waited"] = outcome["waited"]
    if not outcome["states"] and not params.get("nodes"):
        module.warn("no node matches the DCGM exporter's node_selector and tolerations: it runs nowhere")
    if not outcome["done"]:
        pending = {name: state["reason"] for name, state in outcome["states"].items() if not state["ready"]}
        result["diagnosis"] = [f"{name}: {reason}" for name, reason in sorted(pending.items())]
        if not outcome["states"]:
            result["diagnosis"] = ["no node matches the exporter's node_selector and tolerations"]
        raise DevicePluginError(
            f"timed out after {params['wait_timeout']}s waiting for the DCGM exporter: "
            f"{len(outcome['states']) - len(pending)} of {len(outcome['states'])} nodes ready. "
            + " ".join(result["diagnosis"]),
            **result,
        )


def wait_for_exporter(
    client: KubeClient, params: dict, daemonset: dict, timeout: float, clock=time.monotonic, sleep=time.sleep
) -> dict:
    """Poll nodes and the exporter's pods (two lists a round) until a Ready pod of the current template runs on every
    covered node, or the timeout; a DaemonSet with no node to run on is not "ready" when nodes were named."""
    start = clock()
    deadline = start + timeout
    namespace = params["namespace"]
    selector = ",".join(f"{k}={v}" for k, v in sorted(exporter.selector_labels(params).items()))
    pod_spec = daemonset["spec"]["template"]["spec"]
    generation = (daemonset.get("metadata") or {}).get("generation")
    states: dict = {}
    while True:
        nodes = (client.request("GET", "/api/v1/nodes", deadline=deadline).get("items")) or []
        pods = (
            client.request(
                "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector}, deadline=deadline
            ).get("items")
            or []
        )
        states = exporter.node_states(nodes, pods, pod_spec, generation, params.get("nodes"))
        done = all(state["ready"] for state in states.values()) and (bool(states) or not params.get("nodes"))
        if done or clock() + POLL_SECONDS >= deadline:
            return {"done": done, "states": states, "waited": round(clock() - start, 3)}
        sleep(POLL_SECONDS)

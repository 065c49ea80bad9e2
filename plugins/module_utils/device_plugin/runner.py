# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.nvidia_device_plugin: the module's flow (validate, connect, apply or delete, wait, explain),
# kept out of the module file so that the module stays documentation.

from __future__ import annotations

import contextlib
import time

from ansible.module_utils.basic import missing_required_lib
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.apply import (
    apply_object,
    delete_object,
    diff_entry,
    summary,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import (
    check_options,
    expected_counts,
    expected_resources,
    kubeconfig_secrets,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.client import (
    HAS_KUBERNETES,
    KUBERNETES_IMPORT_ERROR,
    KubeClient,
    load_configuration,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.errors import (
    ConfigValidationError,
    DevicePluginError,
    KubeApiError,
    KubeTransportError,
    OptionError,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.manifests import (
    mps_daemonset_name,
    object_path,
    removal_targets,
    render_objects,
    stale_targets,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.plugin_config import (
    capacity_plan,
    config_warnings,
    validate_config,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.waiter import (
    CapacityWait,
    diagnose_timeout,
    refresh_pending,
    wait_for_capacity,
)

_DAEMONSET_STATUS_KEYS = (
    "desiredNumberScheduled",
    "currentNumberScheduled",
    "updatedNumberScheduled",
    "numberReady",
    "numberAvailable",
    "numberUnavailable",
    "numberMisscheduled",
    "observedGeneration",
)


def validate_params(params: dict) -> list:
    """All option and config problems, without touching the network; raises on the first kind found."""
    problems = check_options(params)
    if problems:
        raise OptionError("invalid options: " + "; ".join(problems), option_errors=problems)
    if params.get("config") is not None and params.get("state") == "present":
        config_problems = validate_config(params["config"])
        if config_problems:
            raise ConfigValidationError(config_problems)
        return config_warnings(params["config"])
    return []


def _daemonset_status(obj: dict | None) -> dict:
    status = (obj or {}).get("status") or {}
    return {key: status.get(key, 0) for key in _DAEMONSET_STATUS_KEYS}


def _node_report(tracker: CapacityWait) -> dict:
    report = {}
    for name, state in sorted(tracker.states.items()):
        entry = {
            "capacity": state["capacity"],
            "allocatable": state["allocatable"],
            "expected": state["expected"],
            "resource": state["resource"],
            "ready": state["done"],
            "found": state["found"],
            "node_ready": state["node_ready"],
        }
        if "resources" in state:
            entry["resources"] = state["resources"]
        report[name] = entry
    return report


def _present(module, client, result: dict) -> None:
    params = module.params
    objects = render_objects(params)
    applied = [
        apply_object(client, obj, params["field_manager"], params["force_conflicts"], module.check_mode)
        for obj in objects
    ]
    # What an earlier config needed and this one does not (the MPS control daemon): removed when it is ours.
    removed = [delete_object(client, target, module.check_mode) for target in stale_targets(params)]
    changes = applied + [entry for entry in removed if entry["action"] != "absent"]
    result["changed"] = any(entry["changed"] for entry in changes)
    result["objects"] = [summary(entry) for entry in changes]
    if module._diff:
        result["diff"] = [diff_entry(entry) for entry in changes if entry["changed"]]
    daemonset = applied[-1]["object"]
    result["daemonset"] = _daemonset_status(daemonset)
    if module.check_mode or not params["wait"]:
        # A dry run creates nothing, so there is nothing to wait for.
        return
    pod_spec = objects[-1]["spec"]["template"]["spec"]
    tracker = CapacityWait(
        capacity_plan(params.get("config")),
        pod_spec,
        expected=expected_counts(params),
        names=params.get("nodes"),
        resources=expected_resources(params),
    )
    outcome = wait_for_capacity(client, tracker, float(params["wait_timeout"]), clock=time.monotonic)
    refresh_error = None
    if not outcome["done"]:
        # The tracker may hold what the first list said, when every watch since was throttled or broken.
        refresh_error = refresh_pending(client, tracker, clock=time.monotonic)
        if tracker.complete():
            outcome["done"] = True
            module.warn(
                f"every node reported its {tracker.plan['resource']} capacity, but the wait saw it only in a fresh "
                f"read at its deadline: the API server's node watch gave no event ({client.throttled_count} answers "
                "were 429 Too Many Requests)"
            )
    result["waited"] = outcome["waited"]
    result["nodes"] = _node_report(tracker)
    # Best effort, one try: a throttled or failing read keeps the counters from the apply rather than delaying the
    # result by a Retry-After.
    with contextlib.suppress(KubeApiError, KubeTransportError):
        result["daemonset"] = _daemonset_status(client.get_or_none(object_path(objects[-1]), deadline=client.clock()))
    if outcome["done"]:
        return
    diagnosis = diagnose_timeout(client, tracker, params["namespace"], params["name"], params.get("known_unhealthy"))
    result["diagnosis"] = diagnosis
    _count_requests(client, result)
    done = sum(1 for state in tracker.states.values() if state["done"])
    resource = tracker.plan["resource"]
    stale = (
        f" (as the API server last showed them: reading the pending nodes again at the timeout failed: {refresh_error})"
        if refresh_error
        else ""
    )
    module.fail_json(
        msg=(
            f"timed out after {params['wait_timeout']}s waiting for {resource} capacity: "
            f"{done} of {len(tracker.states)} nodes ready{stale}. " + " ".join(diagnosis)
        ),
        **result,
    )


def _count_requests(client, result: dict) -> None:
    result["api_requests"] = client.request_count
    result["api_throttled"] = client.throttled_count


def _absent(module, client, result: dict) -> None:
    removed = [delete_object(client, target, module.check_mode) for target in removal_targets(module.params)]
    # The MPS control daemon exists only with an MPS config: it is reported when there was one to delete.
    mps_name = mps_daemonset_name(module.params)
    removed = [
        e for e in removed if not (e["name"] == mps_name and e["kind"] == "DaemonSet" and e["action"] == "absent")
    ]
    for entry in removed:
        if entry.get("warning"):
            module.warn(entry["warning"])
    result["changed"] = any(entry["changed"] for entry in removed)
    result["objects"] = [summary(entry) for entry in removed]
    if module._diff:
        result["diff"] = [diff_entry(entry) for entry in removed if entry["changed"]]


def run_module(module) -> None:
    if isinstance(module.params.get("kubeconfig"), dict):
        # An inline kubeconfig is a plain dict option: its tokens and keys would show in the returned invocation.
        module.no_log_values.update(kubeconfig_secrets(module.params["kubeconfig"]))
    if not HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=str(KUBERNETES_IMPORT_ERROR))
    result: dict = {"changed": False, "objects": [], "nodes": {}, "waited": 0, "api_requests": 0, "api_throttled": 0}
    client = None
    try:
        for warning in validate_params(module.params):
            module.warn(warning)
        configuration, _source = load_configuration(module.params)
        if not configuration.verify_ssl:
            module.warn(
                "TLS certificate verification of the API server is disabled (validate_certs=false or an insecure "
                "kubeconfig): the connection can be intercepted; set ca_cert instead"
            )
        # wait_timeout also bounds the retries of each call (429 with Retry-After, 5xx, a broken connection).
        client = KubeClient(configuration, retry_window=float(module.params["wait_timeout"] or 300))
        if module.params["state"] == "present":
            _present(module, client, result)
        else:
            _absent(module, client, result)
    except DevicePluginError as error:
        result.update(error.details)
        if client is not None:
            _count_requests(client, result)
        module.fail_json(msg=error.msg, **result)
    _count_requests(client, result)
    module.exit_json(**result)

# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private to this collection, not a public API: the decisions of the action kubegpu.node.chain_plan (internal to
# kubegpu.node.site's batch play). Pure: the node is reached only through the `run` callable the action passes in,
# which runs one of the collection's own read-only actions (the roles' plans, and service_config in check mode) on the
# node and returns its result.
#
# Which steps of the role chain (nvidia_driver -> nvidia_container_toolkit -> container_runtime -> kubelet) have
# anything to do on a host, read once at the start of its batch, so that site.yml includes only those: a step whose
# role would change nothing, report nothing held back and refuse nothing costs no host-task (Ansible's controller
# spends about as much on a skipped task as on a run one, bench/RESULTS.md). Each step is read again with the arguments
# its role's preflight (site.yml's preflight play, this run) was templated with, from what that preflight read once a
# run (the package source, the role's own files): the same read its role's batch run makes. Conservative by design: a
# step that cannot be judged here (no preflight plan, a read that fails, a runtime other than containerd) has something
# to do, and every step after the first that has is included too, because each may change what the next one finds.

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The role chain, in the order site.yml runs it.
CHAIN = ("nvidia_driver", "nvidia_container_toolkit", "container_runtime", "kubelet")

# How service_config asks whether the service answers, about an earlier change noted as pending that it has started
# with since: systemd's word, once. Any such note is something to do here, whatever the answer (the role's run asks
# again, its own way).
ASK_ONCE = {"retries": 1, "delay": 0.0}

# run(action, args, check_mode) -> the action's result (a dict; `failed` and `msg` when it failed).
Runner = Callable[[str, dict[str, Any], bool], dict[str, Any]]

# Arguments of a role's read that say what its preflight hands over (and what it was handed): the batch's read sets
# them itself.
_HAND_OVER_ARGS = ("checked", "hand_over", "error", "facts_now", "reread_files", "found", "replay")


def replay(args: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """What a role's preflight read hands over for the batch to read the node again as the role would: its own
    arguments (`args`, less those of the hand-over) and what else the role's step needs (`extra`)."""
    return {"args": {key: value for key, value in args.items() if key not in _HAND_OVER_ARGS}, **extra}


def _failed(result: dict[str, Any], what: str) -> str:
    if result.get("failed") or result.get("unreachable"):
        return f"{what} failed ({str(result.get('msg', '')).strip() or 'no message'}): the role says why"
    return ""


def _handed_over(plan: dict[str, Any] | None) -> bool:
    return bool(plan) and isinstance(plan.get("replay"), dict) and isinstance(plan["replay"].get("args"), dict)


def service_work(report: dict[str, Any], service: str) -> str:
    """What kubegpu.node.service_config (check mode) found to do for `service`; '' when nothing."""
    changed = [entry["path"] for entry in report.get("files", []) if entry.get("changed")]
    if changed:
        return f"{service}: {', '.join(changed)} to change"
    if report.get("restart_pending") or report.get("restarted"):
        return f"{service}: a restart is due"
    if report.get("note"):
        return f"{service}: an earlier change is still noted as pending"
    return ""


def driver_work(result: dict[str, Any]) -> str:
    """What the nvidia_driver role's plan leaves to do; '' when nothing (tasks/main.yml: its steps, the reboot)."""
    if "absent" in result:
        return "state absent"
    steps = [name for name, due in (result.get("steps") or {}).items() if due]
    if steps:
        return "its plan has steps to run: " + ", ".join(steps)
    if (result.get("decision") or {}).get("reboot_required"):
        return "a reboot is needed"
    return ""


def toolkit_work(result: dict[str, Any], cdi: bool) -> str:
    """What the nvidia_container_toolkit role's plan leaves to do; '' when nothing (tasks/main.yml, tasks/cdi.yml)."""
    if "remove_files" in result:
        return "state absent"
    steps = [name for name, due in (result.get("steps") or {}).items() if due]
    if steps:
        return "its plan has steps to run: " + ", ".join(steps)
    if not cdi:
        return ""
    plan = result.get("cdi") or {}
    # tasks/cdi.yml changes nothing and lists nothing again only with the refresh units enabled and active, the
    # specification generated, no older specification of the role's, and a list that holds the GPUs. Without the units
    # the role asks nvidia-ctk for the specification every run (it is compared, not read here).
    if not plan.get("units"):
        return "CDI without the refresh units: the role generates the specification and compares it"
    if plan.get("change_units") or not plan.get("generated") or plan.get("remove_own_spec"):
        return "the CDI refresh units or the specification need work"
    if plan.get("list_rc") is None or not plan.get("ok"):
        return "CDI does not list the GPUs"
    return ""


def _plan_again(action: str, plan: dict[str, Any], run: Runner) -> dict[str, Any]:
    """The driver's or the toolkit's plan read again as the role's batch run reads it: the preflight's arguments, from
    its read of the source (`checked`), handing nothing on."""
    return run(action, {**plan["replay"]["args"], "checked": plan.get("checked") or {}, "hand_over": False}, False)


def _compare(service: str, files: list[dict[str, Any]], replay: dict[str, Any], run: Runner, **options: Any) -> str:
    """What kubegpu.node.service_config, in check mode, finds to do for `service` and its files (the role's backup and
    pending folders from `replay`); '' when nothing."""
    args = {
        "service": service,
        "files": files,
        "backup_dir": replay["backup_dir"],
        "pending_dir": replay["pending_dir"],
        "verify": ASK_ONCE,
        **options,
    }
    report = run("kubegpu.node.service_config", args, True)
    return _failed(report, f"{service}'s comparison") or service_work(report, service)


def _driver(plan: dict[str, Any], run: Runner) -> str:
    result = _plan_again("kubegpu.node.nvidia_driver_plan", plan, run)
    return _failed(result, "its plan") or driver_work(result)


def _toolkit(plan: dict[str, Any], run: Runner) -> str:
    result = _plan_again("kubegpu.node.nvidia_container_toolkit_plan", plan, run)
    return _failed(result, "its plan") or toolkit_work(result, bool(plan["replay"]["args"].get("cdi")))


def _runtime(found: dict[str, Any], require_nvidia_runtime: bool, run: Runner) -> str:
    replay = found["replay"]
    checks = {
        **replay["args"],
        "require_nvidia_runtime": require_nvidia_runtime,
        "hand_over": False,
        "found": found,
    }
    result = run("kubegpu.node.container_runtime_checks", checks, False)
    failed = _failed(result, "its checks")
    if failed:
        return failed
    engines = list(result.get("engines") or [])
    others = [engine for engine in engines if engine != "containerd"]
    if others or replay["args"].get("state") != "present":
        # Docker's and CRI-O's configuration is planned by the role's own tasks (and state absent undoes).
        return f"{', '.join(others) or 'state absent'}: planned by the role"
    if not engines:
        return ""
    config = run("kubegpu.node.containerd_config", dict(replay["containerd"]), False)
    failed = _failed(config, "containerd's plan")
    if failed:
        return failed
    return _compare(replay["containerd_service"], config["service_files"], replay, run, restart=False)


def _kubelet(plan: dict[str, Any], run: Runner) -> str:
    replay = plan["replay"]
    result = run("kubegpu.node.kubelet_feature_gates", dict(replay["args"]), False)
    failed = _failed(result, "its plan")
    if failed:
        return failed
    if not (result.get("health") or {}).get("ok"):
        return "the kubelet does not answer"
    return _compare(
        str(result.get("service") or "kubelet.service"),
        result.get("files") or [],
        replay,
        run,
        restart=bool(replay["restart"]),
        daemon_reload=bool(result.get("daemon_reload")),
    )


def _judge(step: str, plan: dict[str, Any], require_nvidia_runtime: bool, run: Runner) -> str:
    if not _handed_over(plan):
        return "no plan of this run's preflight to read again"
    if step == "nvidia_driver":
        return _driver(plan, run)
    if step == "nvidia_container_toolkit":
        return _toolkit(plan, run)
    if step == "container_runtime":
        return _runtime(plan, require_nvidia_runtime, run)
    return _kubelet(plan, run)


def decide(
    steps: list[str],
    plans: dict[str, dict[str, Any]],
    require_nvidia_runtime: bool,
    run: Runner,
) -> dict[str, Any]:
    """The steps (in chain order) to include, and why each was: from the first step with anything to do on.

    `steps`: the chain's steps site.yml runs on this host; `plans`: what each role's preflight handed over (the
    driver's and the toolkit's `replay` and `checked`, the runtime's checks' result, the kubelet's `replay`), absent,
    empty or with a null `replay` when its preflight did not run for it in this run.
    """
    unknown = [step for step in steps if step not in CHAIN]
    if unknown:
        raise ValueError(f"unknown steps of the role chain: {', '.join(unknown)}")
    ordered = [step for step in CHAIN if step in steps]
    reasons: dict[str, str] = {}
    for index, step in enumerate(ordered):
        plan = plans.get(step) or {}
        try:
            reason = _judge(step, plan, require_nvidia_runtime, run)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # A hand-over or a read of an unexpected shape: the step cannot be judged here, so it runs.
            reason = f"could not be judged ({type(exc).__name__}: {exc})"
        if reason:
            reasons[step] = reason
            for later in ordered[index + 1 :]:
                reasons[later] = f"after {step}"
            return {"include": ordered[index:], "reasons": reasons}
        reasons[step] = ""
    return {"include": [], "reasons": reasons}

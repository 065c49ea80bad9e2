# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private helpers of site.yml's plays (through the private filters kubegpu.node._cordon_record,
# kubegpu.node._unreachable_report, kubegpu.node._entry_point_options and kubegpu.node._known_unhealthy), not a public
# API: they can change at any time. The record of a cordon this collection made, read from a Node as the API returns
# it; what site.yml says when hosts of a batch became unreachable; the one argument spec the preflight play checks
# every host's variables against (the playbook's and each included role entry point's); the nodes whose GPUs the
# batch play found unhealthy. Pure: site.yml reads the API, the spec files and the hosts.

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.kubegpu.node.plugins.module_utils._node_cordon import ANNOTATION, record_of, undo_commands
from ansible_collections.kubegpu.node.plugins.plugin_utils._gpu_health import UNHEALTHY

# The batch play's steps, in order, as site.yml notes them in __kubegpu_batch_step.
BATCH_STEPS = ("the role chain", "the drain window", "GPU labels")
UNREACHABLE_POLICIES = ("stop", "continue")


def cordon_record(node: Any) -> dict[str, Any] | None:
    """The record (by, reason, at, undo) on a Node as the API returns it; None for no record, or no node."""
    if node is not None and not isinstance(node, Mapping):
        raise ValueError(f"cordon_record expects a Node object (or none), not {type(node).__name__}")
    return record_of(dict(node) if node is not None else None)


def _host_report(host: Mapping[str, Any]) -> str:
    name = str(host.get("inventory_hostname", "?"))
    step = str(host.get("__kubegpu_batch_step") or BATCH_STEPS[0])
    where = step
    node = host.get("__kubegpu_this_node") or name
    if step == "the drain window" and host.get("__kubegpu_step"):
        where = f'{step}, at "{host["__kubegpu_step"]}"'
    unfinished = list(BATCH_STEPS[BATCH_STEPS.index(step) :]) if step in BATCH_STEPS else [step]
    text = f"{name} became unreachable during {where}; not finished on it: {', '.join(unfinished)}."
    if step != "the drain window":
        return text
    cordon = host.get("__kubegpu_cordon") or {}
    state = cordon.get("cordon") if isinstance(cordon, Mapping) else None
    if state is None and host.get("__kubegpu_cordon_record") is not None:
        state = "recorded"  # an earlier run's cordon, which this window was finishing
    if state == "recorded":
        text += (
            f" Node {node} stays cordoned, with the record {ANNOTATION}: once the host answers, the next run finishes"
            " it (waits until it is Ready and uncordons it, draining it again only when something is still held"
            f" back), or put it back by hand: `{undo_commands(node)}`."
        )
    elif state == "unrecorded":
        text += f" Node {node} was cordoned before this run (no {ANNOTATION} record) and stays cordoned."
    return text


def unreachable_report(lost: Any, later: Any, policy: str) -> str:
    """The message for hosts of a batch that became unreachable.

    ``lost``: the hostvars of each such host (``map('extract', hostvars)``); ``later``: the hosts of the batches that
    have not run yet; ``policy``: kubegpu_unreachable (stop or continue).
    """
    if policy not in UNREACHABLE_POLICIES:
        raise ValueError(f"kubegpu_unreachable must be stop or continue, not {policy!r}")
    if not isinstance(lost, (list, tuple)) or not all(isinstance(h, Mapping) for h in lost):
        raise ValueError("unreachable_report expects the lost hosts' variables (map('extract', hostvars))")
    later = [str(h) for h in (later or [])]
    lines = [_host_report(host) for host in lost]
    if policy == "stop":
        rest = f"the later batches ({', '.join(later)}) were not started, and " if later else ""
        lines.append(
            f"The roll-out stops after this batch: {rest}the device plugin and validation do not run. Bring the host"
            " back and run the playbook again (it carries on where this run stopped), or set kubegpu_unreachable:"
            " continue to carry on without an unreachable host."
        )
    else:
        lines.append(
            "Carrying on without it (kubegpu_unreachable: continue): the later batches run, and the playbook ends"
            " failed with the host unreachable. Run it again once the host answers."
        )
    return " ".join(lines)


def entry_point_options(sources: Any) -> dict[str, Any]:
    """The options of several argument-spec entry points as one spec (ansible.builtin.validate_argument_spec's).

    ``sources``: ``[{"name": "nvidia_driver", "specs": <meta/argument_specs.yml parsed>, "entry_point": "preflight"}]``.
    site.yml's preflight play checks every host's variables against it once, for the playbook and each role entry
    point it includes (which then skip their own check: one host-task a host and include less). An option that two
    entry points both declare must be declared alike (a variable has one type); an entry point that is not in its
    file is an error, not an empty spec.
    """
    if not isinstance(sources, Sequence) or isinstance(sources, (str, bytes)):
        raise ValueError("entry_point_options expects a list of {name, specs, entry_point}")
    options: dict[str, Any] = {}
    declared_by: dict[str, str] = {}
    for source in sources:
        if not isinstance(source, Mapping):
            raise ValueError("entry_point_options expects a list of {name, specs, entry_point}")
        name, entry_point = str(source.get("name")), str(source.get("entry_point", "main"))
        specs = source.get("specs")
        entry = (specs.get("argument_specs") or {}).get(entry_point) if isinstance(specs, Mapping) else None
        if not isinstance(entry, Mapping):
            raise ValueError(f"{name} has no argument spec entry point {entry_point!r}")
        for option, spec in (entry.get("options") or {}).items():
            where = f"{name} ({entry_point})"
            if option in options and options[option] != spec:
                raise ValueError(f"{option} is declared differently by {declared_by[option]} and {where}")
            options.setdefault(option, spec)
            declared_by.setdefault(option, where)
    return options


def known_unhealthy(hosts: Any) -> dict[str, str]:
    """{node: summary} of each host whose GPU health verdict in this run is degraded or failed.

    ``hosts``: each host's variables (``map('extract', hostvars)``): ``gpu_health_result`` (the gpu_health role's
    verdict, absent where it did not run) and ``__kubegpu_this_node`` (its Kubernetes node). For the device plugin's
    capacity-wait diagnosis and the validation table.
    """
    if not isinstance(hosts, Sequence) or isinstance(hosts, (str, bytes)):
        raise ValueError("known_unhealthy expects the hosts' variables (map('extract', hostvars))")
    notes: dict[str, str] = {}
    for host in hosts:
        if not isinstance(host, Mapping):
            raise ValueError("known_unhealthy expects the hosts' variables (map('extract', hostvars))")
        result = host.get("gpu_health_result")
        if isinstance(result, Mapping) and result.get("verdict") in UNHEALTHY:
            node = host.get("__kubegpu_this_node") or host.get("inventory_hostname")
            notes[str(node)] = str(result.get("summary", ""))
    return notes

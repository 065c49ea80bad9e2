# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private helper of site.yml's batch play (through the private filters kubegpu.node._cordon_record and
# kubegpu.node._unreachable_report), not a public API: it can change at any time. The record of a cordon this
# collection made, read from a Node as the API returns it, and what site.yml says when hosts of a batch became
# unreachable. Pure: site.yml reads the API and the hosts.

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.kubegpu.node.plugins.module_utils._node_cordon import ANNOTATION, record_of, undo_commands

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

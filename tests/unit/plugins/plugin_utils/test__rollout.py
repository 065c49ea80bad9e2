"""site.yml's roll-out helpers: the cordon record read from a Node, and the message for unreachable hosts."""

from __future__ import annotations

import json

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils._rollout import cordon_record, unreachable_report

RECORD = "kubegpu.node/cordon"


def _node(annotations=None, unschedulable=False):
    return {"metadata": {"name": "gpu-a", "annotations": annotations or {}}, "spec": {"unschedulable": unschedulable}}


def test_cordon_record_reads_the_record_or_none():
    record = {"by": "kubegpu.node site.yml", "reason": "held back: reboot", "at": "2026-11-25T19:00:00Z", "undo": "x"}
    assert cordon_record(_node({RECORD: json.dumps(record)}, True)) == record
    assert cordon_record(_node({"other": "1"}, True)) is None
    assert cordon_record(None) is None
    # Edited by hand: still a record (the key is this collection's), its text kept as the reason.
    assert cordon_record(_node({RECORD: "kernel upgrade"})) == {"reason": "kernel upgrade"}
    with pytest.raises(ValueError, match="expects a Node object"):
        cordon_record("gpu-a")


def _lost(**facts):
    return {"inventory_hostname": "gpu-b", "__kubegpu_this_node": "node-b", **facts}


def test_a_host_lost_in_the_role_chain_and_the_roll_out_stops():
    message = unreachable_report([_lost(__kubegpu_batch_step="the role chain")], ["gpu-c", "gpu-d"], "stop")
    assert message.startswith(
        "gpu-b became unreachable during the role chain; not finished on it: the role chain, the drain window, GPU "
        "labels. The roll-out stops after this batch: the later batches (gpu-c, gpu-d) were not started, and the "
        "device plugin and validation do not run."
    )
    assert "cordoned" not in message
    assert "kubegpu_unreachable: continue" in message


def test_a_host_lost_inside_its_drain_window_names_the_step_and_how_to_undo_the_cordon():
    host = _lost(
        __kubegpu_batch_step="the drain window",
        __kubegpu_step="apply reboot",
        __kubegpu_cordon={"cordon": "recorded", "changed": True},
    )
    message = unreachable_report([host], [], "stop")
    assert (
        'gpu-b became unreachable during the drain window, at "apply reboot"; not finished on it: the drain window,'
        in (message)
    )
    assert "Node node-b stays cordoned, with the record kubegpu.node/cordon" in message
    assert "`kubectl uncordon node-b && kubectl annotate node node-b kubegpu.node/cordon-`" in message
    assert "the later batches" not in message


def test_a_window_finishing_an_earlier_cordon_and_an_operators_cordon():
    earlier = _lost(
        __kubegpu_batch_step="the drain window",
        __kubegpu_cordon={"skipped": True},
        __kubegpu_cordon_record={"reason": "r"},
    )
    assert "stays cordoned, with the record" in unreachable_report([earlier], [], "stop")
    operator = _lost(__kubegpu_batch_step="the drain window", __kubegpu_cordon={"cordon": "unrecorded"})
    assert "was cordoned before this run (no kubegpu.node/cordon record) and stays cordoned" in unreachable_report(
        [operator], [], "stop"
    )


def test_continue_carries_on_and_says_so():
    message = unreachable_report([_lost(__kubegpu_batch_step="GPU labels")], ["gpu-c"], "continue")
    assert "not finished on it: GPU labels." in message
    assert "Carrying on without it (kubegpu_unreachable: continue)" in message
    assert "stops" not in message


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="stop or continue"):
        unreachable_report([], [], "maybe")
    with pytest.raises(ValueError, match="extract"):
        unreachable_report(["gpu-b"], [], "stop")

"""site.yml's helpers: the cordon record, the unreachable hosts' message, the one argument spec, unhealthy nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.kubegpu.node.plugins.plugin_utils._rollout import (
    cordon_record,
    entry_point_options,
    known_unhealthy,
    unreachable_report,
)

RECORD = "kubegpu.node/cordon"
SITE_SPECS = "playbooks/vars/site_argument_specs.yml"


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


def _specs(**entry_points):
    return {"argument_specs": {name: {"options": options} for name, options in entry_points.items()}}


def test_entry_point_options_joins_the_playbook_and_the_role_entry_points_it_includes():
    site = _specs(site={"kubegpu_serial": {"type": "raw"}})
    driver = _specs(
        main={"nvidia_driver_branch": {"type": "str"}, "nvidia_driver_reboot": {"type": "bool"}},
        preflight={"nvidia_driver_branch": {"type": "str"}},
    )
    kubelet = _specs(plan={"kubelet_restart": {"type": "bool"}, "kubegpu_serial": {"type": "raw"}})
    options = entry_point_options(
        [
            {"name": "site.yml", "entry_point": "site", "specs": site},
            {"name": "nvidia_driver", "entry_point": "preflight", "specs": driver},
            {"name": "kubelet", "entry_point": "plan", "specs": kubelet},
        ]
    )
    # The entry point asked for, not every one of the file (main's nvidia_driver_reboot is not in preflight's).
    assert options == {
        "kubegpu_serial": {"type": "raw"},
        "nvidia_driver_branch": {"type": "str"},
        "kubelet_restart": {"type": "bool"},
    }


def test_entry_point_options_refuses_a_variable_declared_two_ways_and_a_missing_entry_point():
    a = {"name": "a", "entry_point": "main", "specs": _specs(main={"x": {"type": "str"}})}
    b = {"name": "b", "entry_point": "preflight", "specs": _specs(preflight={"x": {"type": "int"}})}
    with pytest.raises(ValueError, match=r"x is declared differently by a \(main\) and b \(preflight\)"):
        entry_point_options([a, b])
    with pytest.raises(ValueError, match="b has no argument spec entry point 'plan'"):
        entry_point_options([a, {**b, "entry_point": "plan"}])
    with pytest.raises(ValueError, match="expects a list"):
        entry_point_options("site")


def test_the_site_preflight_spec_covers_every_option_of_the_role_entry_points_it_includes():
    """The real files: one spec for the preflight play, the four chain roles' entry points in it."""
    root = Path(__file__).resolve().parents[4]

    def role(name):
        return yaml.safe_load((root / "roles" / name / "meta" / "argument_specs.yml").read_text())

    sources = [
        {"name": "site.yml", "entry_point": "site", "specs": yaml.safe_load((root / SITE_SPECS).read_text())},
        {"name": "gpu_health", "entry_point": "main", "specs": role("gpu_health")},
        {"name": "nvidia_driver", "entry_point": "preflight", "specs": role("nvidia_driver")},
        {"name": "nvidia_container_toolkit", "entry_point": "preflight", "specs": role("nvidia_container_toolkit")},
        {"name": "container_runtime", "entry_point": "preflight", "specs": role("container_runtime")},
        {"name": "kubelet", "entry_point": "plan", "specs": role("kubelet")},
    ]
    options = entry_point_options(sources)
    for source in sources[2:]:
        main = source["specs"]["argument_specs"]["main"]["options"]
        # The batch play runs each role's main entry point without its own check: main's options are all here.
        assert set(main) <= set(options), source["name"]
    assert {"kubegpu_serial", "gpu_health_fail_on", "nvidia_driver_branch", "kubelet_restart"} <= set(options)


def test_known_unhealthy_names_the_nodes_whose_gpus_are_degraded_or_failed():
    hosts = [
        {
            "inventory_hostname": "a",
            "__kubegpu_this_node": "node-a",
            "gpu_health_result": {"verdict": "healthy", "summary": "ok"},
        },
        {
            "inventory_hostname": "b",
            "__kubegpu_this_node": "node-b",
            "gpu_health_result": {"verdict": "degraded", "summary": "1 of 8 GPUs: XID 79"},
        },
        {"inventory_hostname": "c", "gpu_health_result": {"verdict": "failed", "summary": "no GPU answers"}},
        {"inventory_hostname": "d", "__kubegpu_this_node": "node-d"},
    ]
    assert known_unhealthy(hosts) == {"node-b": "1 of 8 GPUs: XID 79", "c": "no GPU answers"}
    assert known_unhealthy([]) == {}
    with pytest.raises(ValueError, match="hosts' variables"):
        known_unhealthy("a")

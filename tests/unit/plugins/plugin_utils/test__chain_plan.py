# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The decisions of kubegpu.node.chain_plan (site.yml's batch): which steps of the role chain run, and which reads
# they are judged from. The reads are the roles' own actions; here a stand-in runner answers as each would, and
# records what it was asked. The demo's no-op re-run and bench/fleet run the action itself against real nodes.

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _chain_plan as cp

CHAIN = list(cp.CHAIN)

DRIVER_ARGS = {"state": "present", "branch": "550", "version": "", "kernels": []}
TOOLKIT_ARGS = {"state": "present", "version": "1.17.8-1", "cdi": False}
CHECKS_ARGS = {"state": "present", "engines": [], "nvidia_runtime_path": "/usr/bin/nvidia-container-runtime"}
CONTAINERD_ARGS = {
    "path": "/etc/containerd/config.toml",
    "record": "/var/lib/kubegpu/container_runtime/containerd.json",
}
KUBELET_ARGS = {"device_plugins": True, "service": "kubelet.service"}


def preflight() -> dict[str, dict[str, Any]]:
    """Each role's registered preflight result, as the actions return it when they hand over."""
    return {
        "nvidia_driver": {
            "hand_over": True,
            "checked": {"key": "K"},
            "replay": cp.replay({**DRIVER_ARGS, "hand_over": True}),
        },
        "nvidia_container_toolkit": {
            "hand_over": True,
            "checked": {"key": "T"},
            "replay": cp.replay({**TOOLKIT_ARGS, "hand_over": True, "checked": None}),
        },
        "container_runtime": {
            "installed": ["containerd"],
            "engines": ["containerd"],
            "handover": {"engines": [], "state": "present"},
            "replay": cp.replay(
                {**CHECKS_ARGS, "hand_over": True, "found": {}, "replay": {"x": 1}},
                containerd=CONTAINERD_ARGS,
                containerd_service="containerd.service",
                backup_dir="/var/lib/kubegpu/container_runtime/backup",
                pending_dir="/var/lib/kubegpu/container_runtime/pending",
            ),
        },
        "kubelet": {
            "files": [],
            "replay": cp.replay(
                {**KUBELET_ARGS, "replay": {}},
                restart=True,
                backup_dir="/var/lib/kubegpu/kubelet/backup",
                pending_dir="/var/lib/kubegpu/kubelet/pending",
            ),
        },
    }


IN_PLACE: dict[str, dict[str, Any]] = {
    "kubegpu.node.nvidia_driver_plan": {
        "steps": {"install": False, "activate": False, "facts": False},
        "decision": {"reboot_required": False, "action": "none"},
    },
    "kubegpu.node.nvidia_container_toolkit_plan": {
        "steps": {"packages": False, "configure": False},
        "cdi": {
            "units": True,
            "change_units": False,
            "generated": True,
            "remove_own_spec": False,
            "list_rc": 0,
            "ok": True,
        },
    },
    "kubegpu.node.container_runtime_checks": {"engines": ["containerd"], "installed": ["containerd"]},
    "kubegpu.node.containerd_config": {"service_files": [{"path": "/etc/containerd/config.toml", "content": "x"}]},
    "kubegpu.node.kubelet_feature_gates": {
        "service": "kubelet.service",
        "files": [],
        "daemon_reload": False,
        "health": {"ok": True},
    },
    "kubegpu.node.service_config": {
        "files": [{"path": "/etc/containerd/config.toml", "changed": False}],
        "restart_pending": False,
        "restarted": False,
        "note": False,
    },
}


class Node:
    """Answers each read as the action would on a node in place, except where `answers` says otherwise."""

    def __init__(self, **answers: dict[str, Any]) -> None:
        self.answers = {
            name: {**result, **answers.get(name.rsplit(".", maxsplit=1)[-1], {})} for name, result in IN_PLACE.items()
        }
        self.calls: list[tuple[str, dict[str, Any], bool]] = []

    def __call__(self, name: str, args: dict[str, Any], check_mode: bool) -> dict[str, Any]:
        self.calls.append((name, args, check_mode))
        return dict(self.answers[name])

    def asked(self) -> list[str]:
        return [name.rsplit(".", maxsplit=1)[-1] for name, _args, _check in self.calls]


def test_a_node_in_place_runs_no_step_after_one_read_of_each():
    node = Node()
    decided = cp.decide(CHAIN, preflight(), True, node)
    assert decided == {"include": [], "reasons": dict.fromkeys(CHAIN, "")}
    assert node.asked() == [
        "nvidia_driver_plan",
        "nvidia_container_toolkit_plan",
        "container_runtime_checks",
        "containerd_config",
        "service_config",
        "kubelet_feature_gates",
        "service_config",
    ]


def test_each_read_is_the_roles_batch_read_with_the_preflights_arguments_and_hand_over():
    node = Node()
    plans = preflight()
    cp.decide(CHAIN, plans, False, node)
    calls = {
        (name.rsplit(".", maxsplit=1)[-1], index): (args, check) for index, (name, args, check) in enumerate(node.calls)
    }
    driver = calls[("nvidia_driver_plan", 0)][0]
    # The preflight's own arguments, its read of the source handed over, and nothing handed on from this read.
    assert driver == {**DRIVER_ARGS, "checked": {"key": "K"}, "hand_over": False}
    toolkit = calls[("nvidia_container_toolkit_plan", 1)][0]
    assert toolkit == {**TOOLKIT_ARGS, "checked": {"key": "T"}, "hand_over": False}
    checks = calls[("container_runtime_checks", 2)][0]
    # The batch's requirement of nvidia-container-runtime (false here: a check run whose toolkit step installs it),
    # and the preflight's findings taken over.
    assert checks == {
        **CHECKS_ARGS,
        "require_nvidia_runtime": False,
        "hand_over": False,
        "found": plans["container_runtime"],
    }
    containerd = calls[("containerd_config", 3)][0]
    assert containerd == CONTAINERD_ARGS
    service, check_mode = calls[("service_config", 4)]
    assert check_mode is True
    assert service == {
        "service": "containerd.service",
        "files": [{"path": "/etc/containerd/config.toml", "content": "x"}],
        "restart": False,
        "backup_dir": "/var/lib/kubegpu/container_runtime/backup",
        "pending_dir": "/var/lib/kubegpu/container_runtime/pending",
        # A note's service is asked once (systemd's word), not retried for 30 s: any note is work anyway.
        "verify": {"retries": 1, "delay": 0.0},
    }
    kubelet, check_mode = calls[("kubelet_feature_gates", 5)]
    assert (kubelet, check_mode) == (KUBELET_ARGS, False)
    service, check_mode = calls[("service_config", 6)]
    assert check_mode is True
    assert service["service"] == "kubelet.service" and service["restart"] is True
    assert service["pending_dir"] == "/var/lib/kubegpu/kubelet/pending"


@pytest.mark.parametrize(
    ("answers", "first", "why"),
    [
        (
            {"nvidia_driver_plan": {"steps": {"install": True, "activate": False}}},
            "nvidia_driver",
            "steps to run: install",
        ),
        ({"nvidia_driver_plan": {"decision": {"reboot_required": True}}}, "nvidia_driver", "a reboot is needed"),
        ({"nvidia_driver_plan": {"failed": True, "msg": "dpkg is locked"}}, "nvidia_driver", "dpkg is locked"),
        (
            {"nvidia_container_toolkit_plan": {"steps": {"packages": False, "configure": True}}},
            "nvidia_container_toolkit",
            "configure",
        ),
        ({"container_runtime_checks": {"engines": ["docker"]}}, "container_runtime", "docker: planned by the role"),
        (
            {"container_runtime_checks": {"failed": True, "msg": "no nvidia-container-runtime"}},
            "container_runtime",
            "no nvidia",
        ),
        ({"containerd_config": {"failed": True, "msg": "cannot merge"}}, "container_runtime", "cannot merge"),
        (
            {"service_config": {"files": [{"path": "/etc/containerd/config.toml", "changed": True}]}},
            "container_runtime",
            "containerd.service: /etc/containerd/config.toml to change",
        ),
        ({"service_config": {"restart_pending": True}}, "container_runtime", "a restart is due"),
        ({"service_config": {"note": True}}, "container_runtime", "noted as pending"),
        ({"kubelet_feature_gates": {"health": {"ok": False}}}, "kubelet", "does not answer"),
    ],
)
def test_the_first_step_with_anything_to_do_and_every_later_one_run(answers, first, why):
    node = Node(**answers)
    decided = cp.decide(CHAIN, preflight(), True, node)
    assert decided["include"] == CHAIN[CHAIN.index(first) :]
    assert why in decided["reasons"][first]
    assert all(decided["reasons"][step] == "" for step in CHAIN[: CHAIN.index(first)])
    # Nothing after it is read: it runs anyway.
    later = {
        "nvidia_container_toolkit": "nvidia_container_toolkit_plan",
        "container_runtime": "container_runtime_checks",
    }
    for step in CHAIN[CHAIN.index(first) + 1 :]:
        if step in later:
            assert later[step] not in node.asked()


def test_a_kubelet_change_after_a_runtime_in_place_runs_the_kubelet_only():
    node = Node()
    answers = iter(
        [
            {
                "files": [{"path": "/etc/containerd/config.toml", "changed": False}],
                "restart_pending": False,
                "note": False,
            },
            {
                "files": [{"path": "/var/lib/kubelet/config.yaml", "changed": True}],
                "restart_pending": False,
                "note": False,
            },
        ]
    )
    node.answers["kubegpu.node.service_config"] = {}
    original = node.__call__

    def run(name: str, args: dict[str, Any], check_mode: bool) -> dict[str, Any]:
        return next(answers) if name.endswith("service_config") else original(name, args, check_mode)

    decided = cp.decide(CHAIN, preflight(), True, run)
    assert decided["include"] == ["kubelet"]
    assert decided["reasons"]["kubelet"] == "kubelet.service: /var/lib/kubelet/config.yaml to change"


@pytest.mark.parametrize(
    ("change", "first"),
    [
        # No plan of this run's preflight: the role's tags skipped it, or it was not handed over.
        (lambda plans: plans.pop("nvidia_driver"), "nvidia_driver"),
        (lambda plans: plans["nvidia_container_toolkit"].pop("replay"), "nvidia_container_toolkit"),
        (lambda plans: plans["container_runtime"].pop("replay"), "container_runtime"),
        (lambda plans: plans.update(kubelet={}), "kubelet"),
    ],
)
def test_a_step_without_its_preflights_plan_runs(change, first):
    plans = preflight()
    change(plans)
    decided = cp.decide(CHAIN, plans, True, Node())
    assert decided["include"] == CHAIN[CHAIN.index(first) :]
    assert decided["reasons"][first] == "no plan of this run's preflight to read again"


def test_state_absent_and_cdi_without_refresh_units_run_their_role():
    plans = preflight()
    assert cp.decide(CHAIN, plans, True, Node(nvidia_driver_plan={"absent": {"packages": []}}))["include"] == CHAIN
    plans["nvidia_container_toolkit"]["replay"]["args"]["cdi"] = True
    no_units = Node(nvidia_container_toolkit_plan={"cdi": {"units": False}})
    assert cp.decide(CHAIN, plans, True, no_units)["include"] == CHAIN[1:]
    # With the units in place, CDI that lists the GPUs is nothing to do; one that lists none is.
    assert cp.decide(CHAIN, plans, True, Node())["include"] == []
    unlisted = Node(
        nvidia_container_toolkit_plan={
            "cdi": {**IN_PLACE["kubegpu.node.nvidia_container_toolkit_plan"]["cdi"], "ok": False}
        }
    )
    assert (
        cp.decide(CHAIN, plans, True, unlisted)["reasons"]["nvidia_container_toolkit"] == "CDI does not list the GPUs"
    )
    plans["container_runtime"]["replay"]["args"]["state"] = "absent"
    assert cp.decide(CHAIN, plans, True, Node())["include"] == ["container_runtime", "kubelet"]


def test_only_the_steps_switched_on_are_judged_in_chain_order_and_an_unknown_step_is_refused():
    node = Node()
    decided = cp.decide(["kubelet", "nvidia_driver"], preflight(), True, node)
    assert decided == {"include": [], "reasons": {"nvidia_driver": "", "kubelet": ""}}
    assert node.asked() == ["nvidia_driver_plan", "kubelet_feature_gates", "service_config"]
    assert cp.decide([], preflight(), True, node) == {"include": [], "reasons": {}}
    with pytest.raises(ValueError, match="unknown steps of the role chain: gpu_mig"):
        cp.decide(["gpu_mig"], preflight(), True, node)


def test_replay_keeps_a_reads_own_arguments_and_drops_those_of_the_hand_over():
    args = {
        "state": "present",
        "checked": {"a": 1},
        "hand_over": True,
        "error": "",
        "facts_now": None,
        "found": {},
        "replay": {},
    }
    assert cp.replay(args, restart=True) == {"args": {"state": "present"}, "restart": True}


def test_a_hand_over_of_an_unexpected_shape_is_a_step_that_runs_not_a_failure():
    plans = preflight()
    del plans["container_runtime"]["replay"]["containerd"]
    decided = cp.decide(CHAIN, plans, True, Node())
    assert decided["include"] == ["container_runtime", "kubelet"]
    assert decided["reasons"]["container_runtime"] == "could not be judged (KeyError: 'containerd')"


def test_site_passes_only_what_the_preflight_handed_over():
    # site.yml passes the driver's and the toolkit's replay and checked, the kubelet's replay: the same decisions.
    full = preflight()
    slim = {
        "nvidia_driver": {key: full["nvidia_driver"][key] for key in ("replay", "checked")},
        "nvidia_container_toolkit": {key: full["nvidia_container_toolkit"][key] for key in ("replay", "checked")},
        "container_runtime": full["container_runtime"],
        "kubelet": {"replay": full["kubelet"]["replay"]},
    }
    node = Node()
    assert cp.decide(CHAIN, slim, True, node) == cp.decide(CHAIN, full, True, Node())
    # A role whose preflight did not run in this run: site.yml passes none for its replay.
    slim["nvidia_driver"] = {"replay": None, "checked": None}
    assert cp.decide(CHAIN, slim, True, Node())["reasons"]["nvidia_driver"] == (
        "no plan of this run's preflight to read again"
    )

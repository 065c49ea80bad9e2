"""Validation of the NVIDIA device plugin config file, and the capacity it implies."""

from __future__ import annotations

import pytest
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.plugin_config import (
    capacity_plan,
    config_warnings,
    render_config,
    validate_config,
)

FULL_VALID = {
    "version": "v1",
    "flags": {
        "migStrategy": "none",
        "failOnInitError": True,
        "nvidiaDriverRoot": "/run/nvidia/driver",
        "nvidiaDevRoot": "/",
        "gdsEnabled": False,
        "mofedEnabled": False,
        "gdrcopyEnabled": False,
        "useNodeFeatureAPI": False,
        "deviceDiscoveryStrategy": "auto",
        "mpsRoot": "/run/nvidia/mps",
        "plugin": {
            "passDeviceSpecs": True,
            "deviceListStrategy": ["envvar", "cdi-annotations"],
            "deviceIDStrategy": "uuid",
            "cdiAnnotationPrefix": "cdi.k8s.io/",
            "nvidiaCTKPath": "/usr/bin/nvidia-ctk",
            "containerDriverRoot": "/driver-root",
        },
        "gfd": {"oneshot": False, "noTimestamp": False, "sleepInterval": "60s", "outputFile": "/etc/kubernetes/x"},
    },
    "sharing": {
        "timeSlicing": {
            "renameByDefault": False,
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
        }
    },
    "imex": {"channelIDs": [0], "required": False},
}


def test_full_valid_config_has_no_problems():
    assert validate_config(FULL_VALID) == []


def test_minimal_config_is_valid():
    assert validate_config({"version": "v1"}) == []


@pytest.mark.parametrize("version", [None, "v2", 1])
def test_version_must_be_v1(version):
    config = {"flags": {"migStrategy": "none"}}
    if version is not None:
        config["version"] = version
    assert any(problem.startswith("version:") for problem in validate_config(config))


def test_misplaced_key_names_path_and_where_it_belongs():
    problems = validate_config({"version": "v1", "flags": {"renameByDefault": True}})
    assert problems == [
        "flags.renameByDefault: 'renameByDefault' is not valid under flags; it belongs at "
        "sharing.timeSlicing.renameByDefault or sharing.mps.renameByDefault"
    ]


def test_top_level_flag_is_reported_as_misplaced():
    problems = validate_config({"version": "v1", "migStrategy": "mixed"})
    assert problems == ["migStrategy: 'migStrategy' is not valid at the top level; it belongs at flags.migStrategy"]


def test_plugin_flag_at_flags_level_is_misplaced():
    (problem,) = validate_config({"version": "v1", "flags": {"deviceListStrategy": "envvar"}})
    assert "belongs at flags.plugin.deviceListStrategy" in problem


def test_unknown_key_with_wrong_case_gets_a_suggestion():
    (problem,) = validate_config({"version": "v1", "flags": {"migstrategy": "none"}})
    assert problem == "flags.migstrategy: unknown key 'migstrategy'; did you mean 'migStrategy'?"


def test_unknown_key_lists_known_keys():
    (problem,) = validate_config({"version": "v1", "sharing": {"timeslice": {}}})
    assert problem.startswith("sharing.timeslice: unknown key 'timeslice'")
    assert "mps, timeSlicing" in problem


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        ({"migStrategy": "auto"}, "flags.migStrategy: must be one of none, single, mixed"),
        ({"failOnInitError": "yes"}, "flags.failOnInitError: must be true or false"),
        ({"plugin": {"deviceListStrategy": "cdi"}}, "unknown strategy cdi"),
        ({"plugin": {"deviceListStrategy": []}}, "must be a string or a non-empty list"),
        ({"plugin": {"deviceIDStrategy": "serial"}}, "flags.plugin.deviceIDStrategy: must be one of uuid, index"),
        ({"gfd": {"sleepInterval": "soon"}}, "flags.gfd.sleepInterval: must be a duration"),
    ],
)
def test_flag_values_are_checked(flags, fragment):
    problems = validate_config({"version": "v1", "flags": flags})
    assert any(fragment in problem for problem in problems), problems


@pytest.mark.parametrize("strategy", ["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"])
def test_device_list_strategy_accepts_a_single_string(strategy):
    assert validate_config({"version": "v1", "flags": {"plugin": {"deviceListStrategy": strategy}}}) == []


def test_time_slicing_and_mps_are_exclusive():
    config = {
        "version": "v1",
        "sharing": {
            "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]},
            "mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]},
        },
    }
    assert "sharing: timeSlicing and mps cannot both be set; choose one sharing strategy" in validate_config(config)


def test_mps_is_accepted():
    config = {
        "version": "v1",
        "flags": {"mpsRoot": "/run/nvidia/mps"},
        "sharing": {"mps": {"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
    }
    assert validate_config(config) == []
    assert config_warnings(config) == []


@pytest.mark.parametrize(
    ("mps", "flags", "fragment"),
    [
        (
            {"failRequestsGreaterThanOne": False, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]},
            {},
            "sharing.mps.failRequestsGreaterThanOne: false is ignored by the plugin",
        ),
        ({"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}, {}, "replicas: must be at least 2"),
        ({"resources": []}, {}, "sharing.mps.resources: at least one resource to share is required"),
        ({"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}, {"mpsRoot": "run/mps"}, "must be an absolute"),
        (
            {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]},
            {"migStrategy": "mixed"},
            "MPS shares full GPUs only",
        ),
    ],
)
def test_mps_refusals_where_the_plugin_refuses_or_ignores(mps, flags, fragment):
    problems = validate_config({"version": "v1", "flags": flags, "sharing": {"mps": mps}})
    assert any(fragment in problem for problem in problems), problems


def test_mps_fail_requests_greater_than_one_true_is_fine():
    mps = {"failRequestsGreaterThanOne": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}
    assert validate_config({"version": "v1", "sharing": {"mps": mps}}) == []


def test_more_mps_replicas_than_mps_clients_warns():
    config = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 64}]}}}
    assert validate_config(config) == []
    (warning,) = config_warnings(config)
    assert "at most 48 clients" in warning


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_mps_is_not_allowed_with_mig(strategy):
    config = {
        "version": "v1",
        "flags": {"migStrategy": strategy},
        "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
    }
    (problem,) = validate_config(config)
    assert problem.startswith(f"sharing.mps: MPS cannot be combined with MIG (flags.migStrategy is {strategy})")


@pytest.mark.parametrize(
    ("replicas", "message"), [(1, "at least 2"), (0, "at least 2"), ("4", "integer"), (True, "integer")]
)
def test_replicas_must_be_an_integer_of_at_least_two(replicas, message):
    config = {
        "version": "v1",
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}},
    }
    (problem,) = validate_config(config)
    assert problem.startswith("sharing.timeSlicing.resources[0].replicas:")
    assert message in problem


def test_sharing_resources_need_name_and_replicas():
    config = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"devices": "all"}]}}}
    problems = validate_config(config)
    assert "sharing.timeSlicing.resources[0].name: is required" in problems
    assert "sharing.timeSlicing.resources[0].replicas: is required" in problems


def test_sharing_without_resources_is_an_error():
    problems = validate_config({"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True}}})
    assert problems == ["sharing.timeSlicing.resources: at least one resource to share is required"]


def test_mig_resource_in_sharing_needs_mixed_strategy():
    config = {
        "version": "v1",
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 2}]}},
    }
    (problem,) = validate_config(config)
    assert "exists only with flags.migStrategy mixed" in problem


def test_bad_resource_name_and_devices():
    config = {
        "version": "v1",
        "sharing": {"timeSlicing": {"resources": [{"name": "Nvidia.com/GPU!", "replicas": 2, "devices": "some"}]}},
    }
    problems = validate_config(config)
    assert any("name: 'Nvidia.com/GPU!' is not a valid resource name" in p for p in problems)
    assert any("devices: must be 'all'" in p for p in problems)


def test_imex_channel_ids_must_be_empty_or_zero():
    (problem,) = validate_config({"version": "v1", "imex": {"channelIDs": [1, 2]}})
    assert problem.startswith("imex.channelIDs: must be [] or [0]")


def test_config_that_is_not_a_mapping():
    assert validate_config(["version", "v1"]) == [
        "config: must be a mapping (the device plugin config file, version v1)"
    ]


def test_warnings_for_settings_the_plugin_ignores():
    config = {
        "version": "v1",
        "resources": {"gpus": [{"pattern": "*A100*", "name": "a100"}]},
        "sharing": {
            "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2, "rename": "x", "devices": 2}]}
        },
    }
    assert validate_config(config) == []
    warnings = config_warnings(config)
    assert len(warnings) == 3
    assert any("resources.gpus" in w for w in warnings)


def test_render_config_is_stable_json():
    first = render_config({"version": "v1", "flags": {"migStrategy": "none", "failOnInitError": True}})
    second = render_config({"flags": {"failOnInitError": True, "migStrategy": "none"}, "version": "v1"})
    assert first == second
    assert first.endswith("\n")


def test_capacity_plan_without_config():
    plan = capacity_plan(None)
    assert plan["resource"] == "nvidia.com/gpu"
    assert plan["replicas"] == 1
    assert plan["exact"] is True


def test_capacity_plan_time_slicing_renamed():
    plan = capacity_plan(
        {
            "version": "v1",
            "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [{"name": "gpu", "replicas": 4}]}},
        }
    )
    assert plan["resource"] == "nvidia.com/gpu.shared"
    assert plan["replicas"] == 4
    assert plan["sharing"] == "time-slicing"


def test_capacity_plan_mps():
    plan = capacity_plan(
        {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}
    )
    assert (plan["resource"], plan["replicas"], plan["sharing"]) == ("nvidia.com/gpu", 3, "mps")


@pytest.mark.parametrize(("strategy", "mig_resources"), [("single", False), ("mixed", True)])
def test_capacity_plan_mig_is_not_exact(strategy, mig_resources):
    plan = capacity_plan({"version": "v1", "flags": {"migStrategy": strategy}})
    assert plan["exact"] is False
    assert plan["mig_resources"] is mig_resources

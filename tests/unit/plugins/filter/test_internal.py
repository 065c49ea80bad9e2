"""kubegpu.node's private filters (plugins/filter/__internal.py): each adapts a plugin_utils function to Jinja."""

from __future__ import annotations

import importlib

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.kubegpu.node.plugins.plugin_utils import _mig, _restart_safety, _rollout

internal = importlib.import_module("ansible_collections.kubegpu.node.plugins.filter.__internal")
FILTERS = internal.FilterModule().filters()


def test_every_private_filter_is_underscore_named_and_maps_its_function():
    assert sorted(FILTERS) == [
        "_cordon_record",
        "_entry_point_options",
        "_gpu_mig_resources",
        "_gpu_mig_strategy",
        "_known_unhealthy",
        "_restart_safety",
        "_unreachable_report",
    ]
    assert FILTERS["_restart_safety"].__wrapped__ is _restart_safety.restart_safety
    assert FILTERS["_cordon_record"].__wrapped__ is _rollout.cordon_record
    assert FILTERS["_unreachable_report"].__wrapped__ is _rollout.unreachable_report
    assert FILTERS["_gpu_mig_strategy"].__wrapped__ is _mig.strategy_for
    assert FILTERS["_gpu_mig_resources"].__wrapped__ is _mig.resources_by_node
    assert FILTERS["_entry_point_options"].__wrapped__ is _rollout.entry_point_options
    assert FILTERS["_known_unhealthy"].__wrapped__ is _rollout.known_unhealthy


def test_results_pass_through_and_a_wrong_input_is_a_filter_error():
    assert FILTERS["_restart_safety"]("ActiveState=inactive\n", "docker") == {"safe": True, "reason": ""}
    assert FILTERS["_gpu_mig_strategy"](["", "all-1g.10gb"]) == "mixed"
    with pytest.raises(AnsibleFilterError, match="engine must be one of docker, containerd, cri-o, not 'podman'"):
        FILTERS["_restart_safety"]("", "podman")
    with pytest.raises(AnsibleFilterError, match="must be stop or continue"):
        FILTERS["_unreachable_report"]([], [], "maybe")
    with pytest.raises(AnsibleFilterError, match="mapping of node name"):
        FILTERS["_gpu_mig_resources"]([], "mixed")

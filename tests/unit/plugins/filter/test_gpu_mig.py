"""The MIG and MPS labels of kubegpu.node.gpu_labels."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.kubegpu.node.plugins.filter.gpu_labels import gpu_labels

SINGLE_NODE = {"gpus": 2, "full_gpus": 0, "mig_enabled_gpus": 2, "mig": {"1g.10gb": 14}}


# Labels, with GPU feature discovery's names --------------------------------------------------------------------

A100 = {
    "loaded_version": "550.163.01",
    "gpus": [
        {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960, "compute_capability": "8.0"},
        {"index": 1, "name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960, "compute_capability": "8.0"},
    ],
}
# What the gpu_mig role writes to ansible_local.nvidia_mig: one GPU as 2 x 1g.5gb + 1 x 2g.10gb + 1 x 3g.20gb, one
# without MIG; the attributes are nvidia-smi mig -lgip's for an A100-SXM4-40GB (MIG User Guide).
MIG_FACT = {
    "layout": "inference",
    "pending": False,
    "mig_capable": True,
    "product": "NVIDIA A100-SXM4-40GB",
    "devices": {"gpus": 2, "full_gpus": 1, "mig_enabled_gpus": 1, "mig": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}},
    "profiles": {
        "1g.5gb": {"memory_mib": 4864, "multiprocessors": 14, "decoders": 0, "encoders": 0, "copy_engines": 1},
        "3g.20gb": {
            "memory_mib": 20091,
            "multiprocessors": 42,
            "decoders": 2,
            "encoders": 0,
            "copy_engines": 3,
            "jpeg": 0,
            "ofa": 0,
        },
    },
}


def test_mixed_strategy_labels_each_mig_resource():
    labels = gpu_labels(A100, mig=MIG_FACT, mig_strategy="mixed")
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    # The full GPUs keep their labels under mixed.
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    mig3 = {k.removeprefix("nvidia.com/mig-3g.20gb."): v for k, v in labels.items() if "mig-3g.20gb." in k}
    assert mig3 == {
        "count": "1",
        "product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
        "replicas": "1",
        "sharing-strategy": "none",
        "slices.gi": "3",
        "slices.ci": "3",
        "memory": "20091",
        "multiprocessors": "42",
        "engines.copy": "3",
        "engines.decoder": "2",
        "engines.encoder": "0",
        "engines.jpeg": "0",
        "engines.ofa": "0",
    }
    assert labels["nvidia.com/mig-1g.5gb.count"] == "2"
    # No -lgip attributes for 2g.10gb: only what the name and count tell.
    assert labels["nvidia.com/mig-2g.10gb.slices.gi"] == "2"
    assert "nvidia.com/mig-2g.10gb.memory" not in labels


def test_single_strategy_describes_the_mig_devices_as_the_gpus():
    fact = dict(MIG_FACT, devices=SINGLE_NODE, profiles={"1g.10gb": {"memory_mib": 9856, "multiprocessors": 14}})
    labels = gpu_labels(A100, mig=fact, mig_strategy="single")
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.memory"] == "9856"
    assert not any(k.startswith("nvidia.com/mig-") for k in labels)


def test_time_sliced_mig_devices_are_shared_in_the_labels():
    config = {
        "version": "v1",
        "flags": {"migStrategy": "mixed"},
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 4}]}},
    }
    labels = gpu_labels(A100, mig=MIG_FACT, mig_strategy="mixed", plugin_config=config)
    assert labels["nvidia.com/mig-1g.5gb.replicas"] == "4"
    assert labels["nvidia.com/mig-1g.5gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert labels["nvidia.com/mig-3g.20gb.replicas"] == "1"


def test_without_a_mig_strategy_only_the_capability_is_labelled():
    labels = gpu_labels(A100, mig=MIG_FACT)
    assert labels["nvidia.com/mig.capable"] == "true"
    assert not any(k.startswith(("nvidia.com/mig.strategy", "nvidia.com/mig-")) for k in labels)
    # Without MIG facts the labels are what they always were.
    assert not any("mig" in k for k in gpu_labels(A100))


def test_mps_capable_follows_the_config_and_mig():
    mps = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    assert gpu_labels(A100, plugin_config=mps)["nvidia.com/mps.capable"] == "true"
    # GPU feature discovery: MPS is not offered on a node with a MIG-enabled GPU.
    assert gpu_labels(A100, mig=MIG_FACT, plugin_config=mps)["nvidia.com/mps.capable"] == "false"
    assert "nvidia.com/mps.capable" not in gpu_labels(A100, plugin_config={"version": "v1"})
    with pytest.raises(AnsibleFilterError, match="must be none, single or mixed"):
        gpu_labels(A100, mig=MIG_FACT, mig_strategy="auto")

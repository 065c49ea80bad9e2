"""kubegpu.node.gpu_labels over the nvidia_driver role's fact shapes."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.kubegpu.node.plugins.filter.gpu_labels import (
    gpu_family,
    gpu_labels,
    label_value,
)

A100_NODE = {
    "installed_version": "550.163.01",
    "loaded_version": "550.163.01",
    "branch": "550",
    "cuda_version": "12.4",
    "reboot_required": False,
    "gpus": [
        {
            "index": 1,
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": "GPU-b",
            "memory_total_mib": 81920,
            "compute_capability": "8.0",
        },
        {
            "index": 0,
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": "GPU-a",
            "memory_total_mib": 81920,
            "compute_capability": "8.0",
        },
    ],
}


def test_labels_use_gpu_feature_discoverys_names_and_values() -> None:
    assert gpu_labels(A100_NODE) == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/cuda.driver-version.full": "550.163.01",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "163",
        "nvidia.com/cuda.driver-version.revision": "01",
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4",
    }


def test_driver_not_loaded_yet_labels_what_the_pci_bus_shows() -> None:
    # As the role writes it before the driver is loaded: the GPUs from the PCI bus (no name, no memory).
    facts = {
        "installed_version": "535.261.03",
        "loaded_version": "",
        "gpus_from": "pci",
        "gpu_count": 4,
        "gpus": [{"pci_bus_id": f"0000:0{i}:00.0", "device_id": "10de:20b2"} for i in range(4)],
    }
    assert gpu_labels(facts) == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/cuda.driver-version.full": "535.261.03",
        "nvidia.com/cuda.driver-version.major": "535",
        "nvidia.com/cuda.driver-version.minor": "261",
        "nvidia.com/cuda.driver-version.revision": "03",
    }


@pytest.mark.parametrize("facts", [None, "", {}, {"gpus": [], "pci_gpus": {"count": 0}}])
def test_no_gpu_no_labels(facts: object) -> None:
    assert gpu_labels(facts) == {}


def test_malformed_facts_are_refused() -> None:
    with pytest.raises(AnsibleFilterError, match="list of dicts"):
        gpu_labels({"gpus": "NVIDIA A100"})
    with pytest.raises(AnsibleFilterError, match="as a dict"):
        gpu_labels(["gpu"])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Tesla P4", "Tesla-P4"),
        ("NVIDIA GeForce RTX 4090 (rev a1)", "NVIDIA-GeForce-RTX-4090-rev-a1"),
        ("NVIDIA H100 80GB HBM3" + " x" * 40, ("NVIDIA-H100-80GB-HBM3" + "-x" * 40)[:63]),
    ],
)
def test_product_names_become_valid_label_values(name: str, value: str) -> None:
    assert label_value(name) == value
    assert len(label_value(name)) <= 63


@pytest.mark.parametrize(
    ("major", "minor", "family"),
    [
        (6, 1, "pascal"),
        (7, 0, "volta"),
        (7, 5, "turing"),
        (8, 6, "ampere"),
        (8, 9, "ada-lovelace"),
        (9, 0, "hopper"),
        (10, 0, "blackwell"),
        (4, 0, "undefined"),
    ],
)
def test_families(major: int, minor: int, family: str) -> None:
    assert gpu_family(major, minor) == family

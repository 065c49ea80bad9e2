# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# The filter kubegpu.node.gpu_labels (the node labels GPU feature discovery would set, from the nvidia_driver role's
# facts). Documentation: gpu_labels.yml next to this file. Pure: site.yml reads the facts and talks to the API.

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

PREFIX = "nvidia.com/"
# GPU feature discovery's family names by compute capability (major, minor); the first entry that matches wins.
_FAMILIES: tuple[tuple[int, int | None, str], ...] = (
    (1, None, "tesla"),
    (2, None, "fermi"),
    (3, None, "kepler"),
    (5, None, "maxwell"),
    (6, None, "pascal"),
    (7, 0, "volta"),
    (7, 2, "volta"),
    (7, 5, "turing"),
    (8, 9, "ada-lovelace"),
    (8, None, "ampere"),
    (9, None, "hopper"),
    (10, None, "blackwell"),
    (12, None, "blackwell"),
)
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: Any) -> str:
    """A string as a valid label value: spaces become '-' (as GPU feature discovery writes the product), other
    characters a label value cannot hold are dropped, at most 63 characters, alphanumeric at both ends."""
    value = _LABEL_VALUE_BAD.sub("", str(text).strip().replace(" ", "-"))[:63]
    return value.strip("-_.")


def gpu_family(major: int, minor: int) -> str:
    for want_major, want_minor, name in _FAMILIES:
        if major == want_major and (want_minor is None or minor == want_minor):
            return name
    return "undefined"


def _version_parts(version: str) -> list[str]:
    return [p for p in re.split(r"[.]", version.strip()) if p]


def _first(mapping: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if mapping.get(key) not in (None, ""):
            return mapping[key]
    return None


def gpu_labels(facts: Any, mig: Any = None, mig_strategy: Any = "none", plugin_config: Any = None) -> dict[str, str]:
    """The labels for one node from ``ansible_local.nvidia``; ``{}`` when the facts show no GPU.

    Reads ``gpus`` (a list of ``index``, ``name``, ``uuid``, ``memory_total_mib``, ``compute_capability``; the first
    GPU describes the node, as GPU feature discovery does), ``pci_gpus.count`` when the driver is not loaded,
    ``loaded_version`` (else ``installed_version``) and ``cuda_version`` (when present), as the role writes them.
    With ``mig`` (``ansible_local.nvidia_mig``, from the gpu_mig role) the MIG labels are added for ``mig_strategy``;
    with ``plugin_config`` (the device plugin's config), ``nvidia.com/mps.capable`` when it shares GPUs with MPS.
    """
    labels = _gpu_labels(facts)
    if not labels:
        return labels
    if mig not in (None, ""):
        labels.update(mig_labels(mig, labels.get(f"{PREFIX}gpu.product", ""), mig_strategy, plugin_config))
    sharing = (plugin_config or {}).get("sharing") if isinstance(plugin_config, dict) else None
    if isinstance(sharing, dict) and sharing.get("mps") is not None:
        # GPU feature discovery (internal/lm/nvml.go, newSharingLabeler): true when the config shares GPUs with MPS
        # and no GPU has MIG enabled. NVIDIA's MPS control daemon runs only on nodes with it.
        enabled = int(((mig or {}).get("devices") or {}).get("mig_enabled_gpus") or 0) if isinstance(mig, dict) else 0
        labels[f"{PREFIX}mps.capable"] = "false" if enabled else "true"
    return labels


# GPU feature discovery's MIG device attributes (internal/resource/nvml-mig-device.go, GetAttributes) and where the
# gpu_mig role's facts keep them (from `nvidia-smi mig -lgip`: memory, SM, CE, DEC, ENC, JPEG, OFA).
_MIG_ATTRIBUTES = (
    ("memory", "memory_mib"),
    ("multiprocessors", "multiprocessors"),
    ("engines.copy", "copy_engines"),
    ("engines.decoder", "decoders"),
    ("engines.encoder", "encoders"),
    ("engines.jpeg", "jpeg"),
    ("engines.ofa", "ofa"),
)


def _replication(plugin_config: Any, resource: str) -> tuple[int, bool]:
    """(replicas, renamed) of a resource in the device plugin config's time-slicing (1 and False when not shared)."""
    sharing = plugin_config.get("sharing") if isinstance(plugin_config, dict) else None
    section = (sharing or {}).get("timeSlicing") if isinstance(sharing, dict) else None
    if not isinstance(section, dict):
        return 1, False
    for item in section.get("resources") or []:
        name = str((item or {}).get("name", "")) if isinstance(item, dict) else ""
        if (name if name.startswith(PREFIX) else PREFIX + name) == resource:
            return int(item.get("replicas") or 1), bool(section.get("renameByDefault") or item.get("rename"))
    return 1, False


def mig_labels(mig: Any, product: str, strategy: Any, plugin_config: Any = None) -> dict[str, str]:
    """GPU feature discovery's MIG labels (internal/lm/mig-strategy.go, resource.go, nvml.go) for a node's MIG facts.

    ``nvidia.com/mig.capable``; with the single or mixed strategy ``nvidia.com/mig.strategy`` and, per MIG resource
    (``nvidia.com/gpu`` under single, ``nvidia.com/mig-<profile>`` under mixed), ``count``, ``product``
    (``<GPU>-MIG-<profile>``, ``-SHARED`` when time-sliced without a rename), ``replicas``, ``sharing-strategy``,
    ``slices.gi``, ``slices.ci`` and the attributes ``nvidia-smi mig -lgip`` gives (memory in MiB, multiprocessors,
    engines).
    """
    if not isinstance(mig, dict):
        raise AnsibleFilterError("gpu_labels: the MIG facts (ansible_local.nvidia_mig) must be a dict")
    strategy = str(strategy or "none")
    if strategy not in ("none", "single", "mixed"):
        raise AnsibleFilterError(f"gpu_labels: the MIG strategy must be none, single or mixed, not {strategy!r}")
    labels = {f"{PREFIX}mig.capable": "true" if mig.get("mig_capable") else "false"}
    devices = mig.get("devices") or {}
    profiles = {name: count for name, count in (devices.get("mig") or {}).items() if count}
    if strategy == "none" or not int(devices.get("mig_enabled_gpus") or 0):
        return labels
    labels[f"{PREFIX}mig.strategy"] = strategy
    if strategy == "single" and len(profiles) != 1:
        return labels  # GPU feature discovery labels such a node as invalid; the device plugin step refuses it
    model = str(mig.get("product") or product or "")
    attributes = mig.get("profiles") or {}
    for profile, count in sorted(profiles.items()):
        name = profile.replace("+", ".")
        resource = f"{PREFIX}gpu" if strategy == "single" else f"{PREFIX}mig-{name}"
        replicas, renamed = _replication(plugin_config, resource)
        parts = [label_value(model), "MIG", name] if model else ["MIG", name]
        if replicas > 1 and not renamed:
            parts.append("SHARED")
        slices = re.match(r"(\d+)g\.", profile)
        values = {
            "count": count,
            "product": label_value("-".join(p for p in parts if p)),
            "replicas": replicas,
            "sharing-strategy": "time-slicing" if replicas > 1 else "none",
        }
        if slices:
            values["slices.gi"] = values["slices.ci"] = int(slices.group(1))
        found = attributes.get(profile) or {}
        for label, key in _MIG_ATTRIBUTES:
            if found.get(key) is not None:
                values[label] = found[key]
        for suffix, value in values.items():
            labels[f"{resource}.{suffix}"] = str(value)
    return labels


def _gpu_labels(facts: Any) -> dict[str, str]:
    """The labels of the GPUs themselves (the nvidia_driver role's facts)."""
    if facts in (None, ""):
        return {}
    if not isinstance(facts, dict):
        raise AnsibleFilterError(f"gpu_labels expects the nvidia facts as a dict, not {type(facts).__name__}")
    gpus = facts.get("gpus") or []
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise AnsibleFilterError("gpu_labels: the facts' gpus must be a list of dicts (one per GPU)")
    pci = facts.get("pci_gpus") or {}
    count = len(gpus) or int((pci.get("count") if isinstance(pci, dict) else 0) or 0)
    if count == 0:
        return {}
    labels = {f"{PREFIX}gpu.present": "true", f"{PREFIX}gpu.count": str(count)}
    first = sorted(gpus, key=lambda g: int(g.get("index", 0) or 0))[0] if gpus else {}
    if first.get("name"):
        labels[f"{PREFIX}gpu.product"] = label_value(first["name"])
    memory = _first(first, "memory_total_mib", "memory_mib")
    whole_mib = str(memory).split(".", maxsplit=1)[0]
    if memory is not None and whole_mib.isdigit():
        labels[f"{PREFIX}gpu.memory"] = whole_mib
    capability = str(first.get("compute_capability") or "")
    if re.fullmatch(r"\d+\.\d+", capability):
        major, minor = (int(p) for p in capability.split("."))
        labels[f"{PREFIX}gpu.compute.major"] = str(major)
        labels[f"{PREFIX}gpu.compute.minor"] = str(minor)
        labels[f"{PREFIX}gpu.family"] = gpu_family(major, minor)
    version = str(_first(facts, "loaded_version", "installed_version") or "")
    parts = _version_parts(version)
    if len(parts) >= 2 and all(p.isdigit() for p in parts):
        labels[f"{PREFIX}cuda.driver-version.full"] = label_value(version)
        labels[f"{PREFIX}cuda.driver-version.major"] = parts[0]
        labels[f"{PREFIX}cuda.driver-version.minor"] = parts[1]
        if len(parts) > 2:
            labels[f"{PREFIX}cuda.driver-version.revision"] = parts[2]
    cuda = str(facts.get("cuda_version") or "")
    cuda_parts = _version_parts(cuda)
    if len(cuda_parts) >= 2 and all(p.isdigit() for p in cuda_parts):
        labels[f"{PREFIX}cuda.runtime-version.full"] = label_value(cuda)
        labels[f"{PREFIX}cuda.runtime-version.major"] = cuda_parts[0]
        labels[f"{PREFIX}cuda.runtime-version.minor"] = cuda_parts[1]
    return labels


class FilterModule:
    """kubegpu.node GPU node filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_labels": gpu_labels}

# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of the gpu_mig action and role, and of site.yml's MIG strategy (the private filters
# kubegpu.node._gpu_mig_strategy and _gpu_mig_resources), not a public API: it can change at any time. Pure: no I/O,
# so that the planning runs on the controller and is tested without a GPU.
#
# What it knows:
# - Which GPU models take which MIG profiles (TABLE). Profile names, the fraction of memory and SMs each takes and how
#   many instances a GPU holds come from NVIDIA's MIG User Guide, "Supported MIG Profiles"
#   (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html: tables for A30, A100, H100, H200,
#   B200). Where a model has no table there (H100 NVL/94GB, H100 96GB and GH200, GB200), names and counts come from
#   NVIDIA's own default configuration for its MIG manager (NVIDIA/mig-parted, deployments/systemd/config-default.yaml),
#   which also gives the PCI device IDs that identify each model (its `device-filter` values) and the `all-balanced`
#   layouts. Placements (where an instance may start on the GPU's memory slices) follow the user guide's
#   `nvidia-smi mig -lgipp` output for the A100 ("Getting Started with MIG": {0..6}:1, {0,2,4,6}:2, {0,2,4}:2, {0,4}:4,
#   {0}:4, {0}:8), the same on H100 NVL; NVML refuses a GPU instance whose memory slices overlap an existing one
#   (nvmlDeviceGetGpuInstancePossiblePlacements_v2). A30 has four slices (its table: 1/4 of the memory per 1g).
# - The layout file format of NVIDIA's MIG partition editor (NVIDIA/mig-parted, api/spec/v1/spec.go): version v1,
#   named entries under mig-configs, each a list of {devices, device-filter, mig-enabled, mig-devices}; every entry
#   applies to each GPU it matches (pkg: WalkSelectedMigConfigForEachGPU).
# - What nvidia-smi prints for `--query-gpu`, `mig -lgi`, `mig -lci` and `mig -lgip` (the user guide's examples), and
#   the commands that change MIG: `nvidia-smi -i N -mig 1|0`, `nvidia-smi mig -i N -dci`, `-dgi`, `-cgi P,P -C`.
# - The resources NVIDIA's device plugin advertises: `nvidia.com/gpu` per MIG device under the single strategy,
#   `nvidia.com/mig-<profile>` under mixed, with `+` in a profile name written `.` (k8s-device-plugin,
#   internal/resource/nvml-mig-device.go GetName; internal/rm/rm.go AddDefaultResourcesToConfig).

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from typing import Any

NVIDIA_VENDOR = "10DE"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GPU_RESOURCE = "nvidia.com/gpu"
STRATEGIES = ("none", "single", "mixed")
BUILTIN_LAYOUTS = ("all-disabled", "all-enabled", "all-balanced", "all-<profile>")

_PROFILE = re.compile(r"^(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.(?P<gb>\d+)gb(?P<attr>(?:[+-][a-z.]+)*)$")


@dataclass(frozen=True)
class Profile:
    """A GPU instance profile: compute slices, memory slices it occupies, how many a GPU holds, where they start."""

    name: str
    compute: int
    memory: int
    max_count: int
    starts: tuple[int, ...]

    @property
    def media(self) -> bool:
        return "+me" in self.name


@dataclass(frozen=True)
class Model:
    name: str
    device_ids: tuple[str, ...]
    slices: int
    compute: int
    profiles: dict[str, Profile]
    balanced: dict[str, int]
    source: str


def _geometry_8(names: dict[str, str]) -> dict[str, Profile]:
    """The seven-slice GPUs (eight memory slices, seven SM slices): A100, H100, H200, B200, GB200.

    names maps a shape to the model's profile name: 1g, 1g+me, 1g2 (one SM slice, two memory slices), 2g, 3g, 4g, 7g.
    """
    shapes = {
        "1g": (1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        "1g+me": (1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        "1g2": (1, 2, 4, (0, 2, 4, 6)),
        "2g": (2, 2, 3, (0, 2, 4)),
        "3g": (3, 4, 2, (0, 4)),
        "4g": (4, 4, 1, (0,)),
        "7g": (7, 8, 1, (0,)),
    }
    return {name: Profile(name, *shapes[shape]) for shape, name in names.items()}


def _geometry_4(names: dict[str, str]) -> dict[str, Profile]:
    """A30: four memory slices and four SM slices (1g takes 1/4, 2g 2/4, 4g all)."""
    shapes = {
        "1g": (1, 1, 4, (0, 1, 2, 3)),
        "1g+me": (1, 1, 1, (0, 1, 2, 3)),
        "2g": (2, 2, 2, (0, 2)),
        "2g+me": (2, 2, 1, (0, 2)),
        "4g": (4, 4, 1, (0,)),
    }
    return {name: Profile(name, *shapes[shape]) for shape, name in names.items()}


def _ids(*devices: str) -> tuple[str, ...]:
    return tuple(f"0x{device.upper()}{NVIDIA_VENDOR}" for device in devices)


_GUIDE = "NVIDIA MIG User Guide, Supported MIG Profiles"
_PARTED = "NVIDIA/mig-parted deployments/systemd/config-default.yaml"

TABLE: tuple[Model, ...] = (
    Model(
        "A30-24GB",
        _ids("20B7"),
        4,
        4,
        _geometry_4({"1g": "1g.6gb", "1g+me": "1g.6gb+me", "2g": "2g.12gb", "2g+me": "2g.12gb+me", "4g": "4g.24gb"}),
        {"1g.6gb": 2, "2g.12gb": 1},
        f"{_GUIDE} (A30 MIG Profiles); device ID and balanced layout: {_PARTED}",
    ),
    Model(
        "A100-40GB (A100-SXM4-40GB, A100-PCIE-40GB, A800 40GB)",
        _ids("20B0", "20B1", "20F1", "20F6"),
        8,
        7,
        _geometry_8(
            {
                "1g": "1g.5gb",
                "1g+me": "1g.5gb+me",
                "1g2": "1g.10gb",
                "2g": "2g.10gb",
                "3g": "3g.20gb",
                "4g": "4g.20gb",
                "7g": "7g.40gb",
            }
        ),
        {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        f"{_GUIDE} (Table 6, A100-SXM4-40GB); device IDs and balanced layout: {_PARTED}",
    ),
    Model(
        "A100-80GB and H100-80GB (A100-SXM4-80GB, A100 80GB PCIe, A800 80GB, H100 80GB SXM5/PCIe, H800 80GB)",
        _ids("20B2", "20B5", "20F3", "20F5", "2330", "2331", "2322", "2324"),
        8,
        7,
        _geometry_8(
            {
                "1g": "1g.10gb",
                "1g+me": "1g.10gb+me",
                "1g2": "1g.20gb",
                "2g": "2g.20gb",
                "3g": "3g.40gb",
                "4g": "4g.40gb",
                "7g": "7g.80gb",
            }
        ),
        {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        f"{_GUIDE} (A100-SXM4-80GB names; Table 7, H100); device IDs and balanced layout: {_PARTED}",
    ),
    Model(
        "H100-94GB (H100 NVL, H800 NVL)",
        _ids("2321", "233A"),
        8,
        7,
        _geometry_8(
            {
                "1g": "1g.12gb",
                "1g+me": "1g.12gb+me",
                "1g2": "1g.24gb",
                "2g": "2g.24gb",
                "3g": "3g.47gb",
                "4g": "4g.47gb",
                "7g": "7g.94gb",
            }
        ),
        {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1},
        f"{_PARTED} (H100 NVL, H800 NVL); {_GUIDE} lists H100 94GB with 7 instances",
    ),
    Model(
        "H100-96GB (H100 on GH200 96GB, H20, PG506-96GB)",
        _ids("2342", "233D", "20B6", "2329"),
        8,
        7,
        _geometry_8(
            {
                "1g": "1g.12gb",
                "1g+me": "1g.12gb+me",
                "1g2": "1g.24gb",
                "2g": "2g.24gb",
                "3g": "3g.48gb",
                "4g": "4g.48gb",
                "7g": "7g.96gb",
            }
        ),
        {"1g.12gb": 2, "2g.24gb": 1, "3g.48gb": 1},
        f"{_PARTED} (H100-96GB, PG506-96GB, GH200, H20); {_GUIDE} lists H100 on GH200 (96GB) with 7 instances",
    ),
    Model(
        "H200-141GB (H200 SXM5, H200 NVL)",
        _ids("2335", "233B"),
        8,
        7,
        _geometry_8(
            {
                "1g": "1g.18gb",
                "1g+me": "1g.18gb+me",
                "1g2": "1g.35gb",
                "2g": "2g.35gb",
                "3g": "3g.71gb",
                "4g": "4g.71gb",
                "7g": "7g.141gb",
            }
        ),
        {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
        f"{_GUIDE} (Table 8, H200); device IDs and balanced layout: {_PARTED}",
    ),
    Model(
        "GH200-144GB (GH200 144G HBM3e)",
        _ids("2348"),
        8,
        7,
        _geometry_8(
            {
                "1g": "1g.18gb",
                "1g+me": "1g.18gb+me",
                "1g2": "1g.36gb",
                "2g": "2g.36gb",
                "3g": "3g.72gb",
                "4g": "4g.72gb",
                "7g": "7g.144gb",
            }
        ),
        {"1g.18gb": 2, "2g.36gb": 1, "3g.72gb": 1},
        f"{_PARTED} (GH200 144G HBM3e)",
    ),
    Model(
        "B200",
        _ids("2901"),
        8,
        7,
        _geometry_8(
            {
                "1g": "1g.23gb",
                "1g+me": "1g.23gb+me",
                "1g2": "1g.45gb",
                "2g": "2g.45gb",
                "3g": "3g.90gb",
                "4g": "4g.90gb",
                "7g": "7g.180gb",
            }
        ),
        {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1},
        f"{_GUIDE} (Table 9, B200); device ID and balanced layout: {_PARTED}",
    ),
    Model(
        "GB200",
        _ids("2941"),
        8,
        7,
        _geometry_8(
            {
                "1g": "1g.23gb",
                "1g+me": "1g.23gb+me",
                "1g2": "1g.47gb",
                "2g": "2g.47gb",
                "3g": "3g.93gb",
                "4g": "4g.93gb",
                "7g": "7g.186gb",
            }
        ),
        {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1},
        f"{_PARTED} (GB200 HGX); {_GUIDE} lists GB200 (186GB) with 7 instances",
    ),
)


class MigError(ValueError):
    """A layout or a reading that cannot be used; the message says what to change."""


# ---- device IDs and the table -----------------------------------------------------------------------------------


def device_id(value: Any) -> str:
    """A PCI device ID as mig-parted and nvidia-smi's pci.device_id write it: 0x20B010DE (device, then vendor).

    Accepts that form, lspci's 10de:20b0, or a bare device 0x20b0 / 20b0 (vendor NVIDIA).
    """
    text = str(value or "").strip().lower()
    match = re.fullmatch(r"10de:([0-9a-f]{4})", text) or re.fullmatch(r"(?:0x)?([0-9a-f]{4})", text)
    if match:
        return f"0x{match.group(1).upper()}{NVIDIA_VENDOR}"
    match = re.fullmatch(r"(?:0x)?([0-9a-f]{4})([0-9a-f]{4})", text)
    if match:
        return f"0x{match.group(1).upper()}{match.group(2).upper()}"
    raise MigError(f"{value!r} is not a PCI device ID (expected 0x20B010DE or 10de:20b0)")


def find_model(pci_device_id: str) -> Model | None:
    wanted = device_id(pci_device_id)
    for model in TABLE:
        if wanted in model.device_ids:
            return model
    return None


def parse_profile(name: str) -> dict[str, Any]:
    """A profile name's parts: compute instance slices (None for a whole GPU instance), GPU slices, GB, attributes."""
    match = _PROFILE.match(str(name))
    if not match:
        raise MigError(f"{name!r} is not a MIG profile name (such as 1g.10gb, 3g.40gb or 1g.10gb+me)")
    return {
        "ci": int(match.group("c")) if match.group("c") else None,
        "g": int(match.group("g")),
        "gb": int(match.group("gb")),
        "attributes": match.group("attr"),
    }


def resource_name(profile: str) -> str:
    """The extended resource NVIDIA's device plugin advertises for a profile under the mixed strategy."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


# ---- fitting a set of instances onto one GPU ---------------------------------------------------------------------


def fit(model: Model, counts: dict[str, int]) -> list[tuple[str, int]]:
    """Where each instance of ``counts`` goes on a GPU of ``model``: [(profile, start memory slice)], largest first.

    Raises MigError saying why the GPU cannot take them: a profile the model does not have, more instances of a
    profile than it holds, more than one media-extension instance, or no placement without overlapping memory slices
    within the GPU's compute slices.
    """
    instances: list[Profile] = []
    for name, count in counts.items():
        parsed = parse_profile(name)
        if parsed["ci"] is not None:
            raise MigError(
                f"{name}: compute-instance profiles (several compute instances in one GPU instance) are not supported; "
                "use GPU instance profiles such as "
                f"{parsed['g']}g.{parsed['gb']}gb (each gets one compute instance over all its slices)"
            )
        profile = model.profiles.get(name)
        if profile is None:
            raise MigError(f"{model.name} has no MIG profile {name} (it has {', '.join(model.profiles)})")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise MigError(f"{name}: the count must be a whole number, not {count!r}")
        if count > profile.max_count:
            raise MigError(f"{model.name} holds at most {profile.max_count} instances of {name}, not {count}")
        instances += [profile] * count
    media = sum(1 for p in instances if p.media)
    if media > 1:
        raise MigError(f"{model.name}: only one instance per GPU can include the media extensions (+me), not {media}")
    compute = sum(p.compute for p in instances)
    if compute > model.compute:
        raise MigError(f"{model.name} has {model.compute} compute slices; {_describe(counts)} needs {compute}")
    # Larger instances first: their placements are the most constrained. NVIDIA's user guide also asks for the 3g
    # profile first when creating a 3-2-1-1 geometry.
    order = sorted(instances, key=lambda p: (-p.memory, -p.compute, p.name))
    placed = _place(order, 0, [], model.slices)
    if placed is None:
        raise MigError(f"{model.name} cannot place {_describe(counts)} without overlapping memory slices")
    return placed


def _place(order: list[Profile], used: int, placed: list[tuple[str, int]], slices: int):
    if len(placed) == len(order):
        return placed
    profile = order[len(placed)]
    for start in profile.starts:
        mask = ((1 << profile.memory) - 1) << start
        if start + profile.memory <= slices and not used & mask:
            found = _place(order, used | mask, [*placed, (profile.name, start)], slices)
            if found is not None:
                return found
    return None


def _describe(counts: dict[str, int]) -> str:
    parts = [f"{count} x {name}" for name, count in counts.items() if count]
    return " + ".join(parts) if parts else "no instance"


# ---- the layout file (mig-parted's format, version v1) -------------------------------------------------------------

_ENTRY_KEYS = {"devices", "device-filter", "mig-enabled", "mig-devices"}


def validate_layouts(config: Any) -> list[str]:
    """Problems of a mig-parted style layout file (empty when it is usable), as mig-parted's parser refuses them."""
    if config in (None, {}):
        return []
    if not isinstance(config, dict):
        return ["the MIG layouts must be a mapping (version: v1, mig-configs: {...})"]
    problems = []
    if config.get("version") != "v1":
        problems.append(f"version: must be v1 (got {config.get('version')!r})")
    unknown = sorted(set(config) - {"version", "mig-configs"})
    if unknown:
        problems.append(f"unexpected field(s) {', '.join(map(str, unknown))} (known: version, mig-configs)")
    layouts = config.get("mig-configs")
    if not isinstance(layouts, dict) or not layouts:
        problems.append("mig-configs: at least one named layout is required")
        return problems
    for name, entries in layouts.items():
        where = f"mig-configs.{name}"
        if not isinstance(entries, list) or not entries:
            problems.append(f"{where}: must be a non-empty list of entries")
            continue
        for position, entry in enumerate(entries):
            problems += _entry_problems(f"{where}[{position}]", entry)
    return problems


def _entry_problems(where: str, entry: Any) -> list[str]:
    if not isinstance(entry, dict):
        return [f"{where}: must be a mapping"]
    problems = [f"{where}: unexpected field {key}" for key in sorted(set(map(str, entry)) - _ENTRY_KEYS)]
    for required in ("devices", "mig-enabled"):
        if required not in entry:
            problems.append(f"{where}: missing required field {required}")
    devices = entry.get("devices")
    if (
        "devices" in entry
        and devices != "all"
        and not (
            isinstance(devices, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
        )
    ):
        problems.append(f"{where}.devices: must be 'all' or a list of GPU indexes, not {devices!r}")
    if "device-filter" in entry:
        filters = entry["device-filter"]
        for item in filters if isinstance(filters, list) else [filters]:
            try:
                device_id(item)
            except MigError as error:
                problems.append(f"{where}.device-filter: {error}")
    enabled = entry.get("mig-enabled")
    if "mig-enabled" in entry and not isinstance(enabled, bool):
        problems.append(f"{where}.mig-enabled: must be true or false")
    mig_devices = entry.get("mig-devices")
    if enabled is True and mig_devices is None:
        problems.append(f"{where}: missing required field 'mig-devices' when 'mig-enabled' is true")
    if enabled is False and mig_devices:
        problems.append(f"{where}: MIG devices included when 'mig-enabled' is false")
    if mig_devices is not None and not isinstance(mig_devices, dict):
        problems.append(f"{where}.mig-devices: must be a mapping of profile to count")
    elif mig_devices:
        for profile, count in mig_devices.items():
            try:
                parse_profile(profile)
            except MigError as error:
                problems.append(f"{where}.mig-devices: {error}")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                problems.append(f"{where}.mig-devices.{profile}: the count must be a whole number, not {count!r}")
    return problems


def _matches(entry: dict[str, Any], index: int, pci_id: str) -> bool:
    filters = entry.get("device-filter")
    if filters not in (None, "", []):
        wanted = {device_id(f) for f in (filters if isinstance(filters, list) else [filters])}
        if pci_id not in wanted:
            return False
    devices = entry.get("devices")
    return devices == "all" or (isinstance(devices, list) and index in devices)


def builtin_layout(name: str) -> list[dict[str, Any]] | None:
    """The entries of a built-in layout name, per GPU model (None when the name is not built in).

    all-disabled, all-enabled (MIG on, no instances), all-balanced (NVIDIA's balanced layout of each model) and
    all-<profile> (as many instances of that profile as each GPU holds, the way NVIDIA's default configuration names
    them: all-1g.10gb, all-3g.40gb; a `+me` profile may be written `.me`, as in all-1g.10gb.me).
    """
    if name == "all-disabled":
        return [{"devices": "all", "mig-enabled": False}]
    if name == "all-enabled":
        return [{"devices": "all", "mig-enabled": True, "mig-devices": {}}]
    if name == "all-balanced":
        return [
            {"device-filter": list(m.device_ids), "devices": "all", "mig-enabled": True, "mig-devices": m.balanced}
            for m in TABLE
        ]
    match = re.fullmatch(r"all-(\d+g\.\d+gb)(\.me)?", name)
    if not match:
        return None
    profile = match.group(1) + ("+me" if match.group(2) else "")
    entries = [
        {
            "device-filter": list(m.device_ids),
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {profile: m.profiles[profile].max_count},
        }
        for m in TABLE
        if profile in m.profiles
    ]
    return entries or [{"devices": "all", "mig-enabled": True, "mig-devices": {profile: 1}}]


def layout_entries(config: Any, name: str) -> list[dict[str, Any]]:
    """The entries of the layout ``name``: the user's file first, then the built-in names."""
    layouts = (config or {}).get("mig-configs") or {}
    if name in layouts:
        return layouts[name]
    entries = builtin_layout(name)
    if entries is None:
        known = [*sorted(layouts), *BUILTIN_LAYOUTS]
        raise MigError(f"no MIG layout named {name!r} (known: {', '.join(known)})")
    return entries


def wanted_per_gpu(entries: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """GPU index -> {enabled, devices, entry} for each GPU an entry matches; two entries with different content for
    the same GPU are an error (mig-parted would apply both, the last one winning, which hides a mistake)."""
    wanted: dict[int, dict[str, Any]] = {}
    for position, entry in enumerate(entries):
        for gpu in gpus:
            if not _matches(entry, gpu["index"], gpu["device_id"]):
                continue
            spec = {
                "enabled": bool(entry.get("mig-enabled")),
                "devices": {k: v for k, v in (entry.get("mig-devices") or {}).items() if v},
                "entry": position,
                "devices_all": entry.get("devices") == "all" and not entry.get("device-filter"),
            }
            previous = wanted.get(gpu["index"])
            if previous and (previous["enabled"], previous["devices"]) != (spec["enabled"], spec["devices"]):
                raise MigError(
                    f"GPU {gpu['index']} is matched by entries {previous['entry']} and {position} with different "
                    "settings; give each GPU one entry (devices: [indexes], or device-filter)"
                )
            wanted[gpu["index"]] = spec
    return wanted


# ---- reading nvidia-smi --------------------------------------------------------------------------------------------

QUERY_FIELDS = ("index", "uuid", "name", "pci.device_id", "mig.mode.current", "mig.mode.pending", "memory.total")
_MISSING = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", ""}
_SECTION = re.compile(r"^@@kubegpu (\w+) (-?\d+)$")
_LGI_ROW = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|$")
_LCI_ROW = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+\|$")
_LGIP_ROW = re.compile(
    r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+(\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|$"
)
_LGIP_CONT = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s+\|$")


def split_sections(text: str) -> dict[str, dict[str, Any]]:
    """The read script's output: '@@kubegpu NAME RC' lines, each followed by that command's output."""
    sections: dict[str, dict[str, Any]] = {}
    current = None
    for line in str(text or "").splitlines():
        match = _SECTION.match(line.strip())
        if match:
            current = {"rc": int(match.group(2)), "lines": []}
            sections[match.group(1)] = current
        elif current is not None:
            current["lines"].append(line)
    return {name: {"rc": s["rc"], "text": "\n".join(s["lines"]).strip()} for name, s in sections.items()}


def _mode(value: str) -> bool | None:
    value = value.strip()
    if value in _MISSING:
        return None
    if value.lower() == "enabled":
        return True
    if value.lower() == "disabled":
        return False
    raise MigError(f"unknown MIG mode {value!r} (expected Enabled, Disabled or [N/A])")


def parse_query(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=index,uuid,name,pci.device_id,mig.mode.current,mig.mode.pending,memory.total
    --format=csv,noheader,nounits`: one dict per GPU (MIG modes None where the GPU has no MIG)."""
    gpus = []
    for row in csv.reader(str(text or "").splitlines(), skipinitialspace=True):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(QUERY_FIELDS):
            raise MigError(f"nvidia-smi --query-gpu: {len(row)} values where {len(QUERY_FIELDS)} were asked: {row!r}")
        values = dict(zip(QUERY_FIELDS, (c.strip() for c in row)))
        memory = re.match(r"\d+", values["memory.total"])
        gpus.append(
            {
                "index": int(values["index"]),
                "uuid": values["uuid"],
                "name": values["name"],
                "device_id": device_id(values["pci.device_id"]),
                "mig_current": _mode(values["mig.mode.current"]),
                "mig_pending": _mode(values["mig.mode.pending"]),
                "memory_mib": int(memory.group(0)) if memory else None,
            }
        )
    return sorted(gpus, key=lambda g: g["index"])


def parse_pci(text: str) -> list[dict[str, Any]]:
    """Lines 'ADDRESS VENDOR DEVICE CLASS' from sysfs: NVIDIA display and 3D controllers, in bus order, numbered as
    NVML numbers them when nothing reorders them (an assumption used only before the driver answers)."""
    gpus = []
    for line in str(text or "").splitlines():
        parts = line.lower().split()
        if len(parts) == 4 and parts[1] == "0x10de" and parts[3].startswith(("0x0300", "0x0302")):
            gpus.append({"pci_bus_id": parts[0], "device_id": device_id(parts[2])})
    gpus.sort(key=lambda g: g["pci_bus_id"])
    return [dict(g, index=i) for i, g in enumerate(gpus)]


def parse_lgi(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi mig -lgi`: the GPU instances (gpu, profile, profile_id, id, start, size)."""
    rows = []
    for line in str(text or "").splitlines():
        match = _LGI_ROW.match(line.strip())
        if match:
            gpu, name, profile_id, gi, start, size = match.groups()
            rows.append(
                {
                    "gpu": int(gpu),
                    "profile": name,
                    "profile_id": int(profile_id),
                    "id": int(gi),
                    "start": int(start),
                    "size": int(size),
                }
            )
    return rows


def parse_lci(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi mig -lci`: the compute instances (gpu, gi, profile, profile_id, id)."""
    rows = []
    for line in str(text or "").splitlines():
        match = _LCI_ROW.match(line.strip())
        if match:
            gpu, gi, name, profile_id, ci = match.groups()
            rows.append({"gpu": int(gpu), "gi": int(gi), "profile": name, "profile_id": int(profile_id), "id": int(ci)})
    return rows


def parse_lgip(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi mig -lgip`: each GPU's instance profiles with their attributes (two table lines per profile)."""
    rows: list[dict[str, Any]] = []
    for line in str(text or "").splitlines():
        line = line.strip()
        match = _LGIP_ROW.match(line)
        if match:
            gpu, name, pid, free, total, memory, p2p, sm, dec, enc = match.groups()
            rows.append(
                {
                    "gpu": int(gpu),
                    "profile": name,
                    "profile_id": int(pid),
                    "free": int(free),
                    "total": int(total),
                    "memory_mib": round(float(memory) * 1024),
                    "p2p": p2p.lower() == "yes",
                    "multiprocessors": int(sm),
                    "decoders": int(dec),
                    "encoders": int(enc),
                }
            )
            continue
        cont = _LGIP_CONT.match(line)
        if cont and rows and "copy_engines" not in rows[-1]:
            rows[-1].update(copy_engines=int(cont.group(1)), jpeg=int(cont.group(2)), ofa=int(cont.group(3)))
    return rows


def read_state(text: str) -> dict[str, Any]:
    """The node's MIG state from the role's read script (sections gpus, apps, lgi, lci, lgip, pci).

    ``smi`` is whether nvidia-smi answered; when it did not (no driver loaded yet), the GPUs come from the PCI bus,
    without MIG modes or instances.
    """
    sections = split_sections(text)
    gpus_section = sections.get("gpus") or {"rc": 127, "text": ""}
    state: dict[str, Any] = {"smi": gpus_section["rc"] == 0, "smi_error": "", "gpus": [], "busy": {}}
    if state["smi"]:
        gpus = parse_query(gpus_section["text"])
        instances = parse_lgi((sections.get("lgi") or {}).get("text", ""))
        computes = parse_lci((sections.get("lci") or {}).get("text", ""))
        profiles = parse_lgip((sections.get("lgip") or {}).get("text", ""))
        for gpu in gpus:
            gis = [dict(gi, cis=[]) for gi in instances if gi["gpu"] == gpu["index"]]
            for gi in gis:
                gi["cis"] = [ci for ci in computes if ci["gpu"] == gpu["index"] and ci["gi"] == gi["id"]]
            gpu["instances"] = sorted(gis, key=lambda g: (g["start"], g["id"]))
            gpu["profiles"] = {p["profile"]: p for p in profiles if p["gpu"] == gpu["index"]}
        state["gpus"] = gpus
        apps = sections.get("apps") or {"rc": 0, "text": ""}
        for row in csv.reader(apps["text"].splitlines(), skipinitialspace=True):
            if len(row) >= 2 and row[0].strip().startswith("GPU-"):
                state["busy"].setdefault(row[0].strip(), []).append(
                    f"{row[2].strip() if len(row) > 2 else 'process'} (pid {row[1].strip()})"
                )
    else:
        state["smi_error"] = gpus_section["text"].splitlines()[0] if gpus_section["text"] else "nvidia-smi not found"
        state["gpus"] = [
            dict(g, uuid=None, name=None, mig_current=None, mig_pending=None, instances=[], profiles={})
            for g in parse_pci((sections.get("pci") or {}).get("text", ""))
        ]
    return state


# ---- planning -------------------------------------------------------------------------------------------------------


def _current_devices(gpu: dict[str, Any]) -> tuple[dict[str, int], bool]:
    """(profile -> count of GPU instances, clean): clean when each GPU instance has exactly one compute instance
    spanning it (the one `-cgi ... -C` creates, named as the GPU instance's profile)."""
    counts: dict[str, int] = {}
    clean = True
    for gi in gpu.get("instances") or []:
        counts[gi["profile"]] = counts.get(gi["profile"], 0) + 1
        cis = gi.get("cis") or []
        if len(cis) != 1 or cis[0]["profile"] != gi["profile"]:
            clean = False
    return counts, clean


def _smi(*args: Any) -> list[str]:
    return ["nvidia-smi", *(str(a) for a in args)]


@dataclass
class GpuPlan:
    index: int
    model: str | None
    device_id: str
    uuid: str | None
    wanted: dict[str, Any] | None
    action: str = "none"
    mode_change: bool = False
    reset_required: bool = False
    commands: list[list[str]] = field(default_factory=list)
    placements: list[tuple[str, int]] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "model": self.model,
            "device_id": self.device_id,
            "uuid": self.uuid,
            "mig": None if self.wanted is None else self.wanted["enabled"],
            "devices": None if self.wanted is None else dict(self.wanted["devices"]),
            "action": self.action,
            "mode_change": self.mode_change,
            "reset_required": self.reset_required,
            "commands": self.commands,
            "placements": [{"profile": p, "start": s} for p, s in self.placements],
            "busy": self.busy,
            "note": self.note,
        }


def plan(state: dict[str, Any], config: Any, layout: str) -> dict[str, Any]:
    """What to do on one node to reach ``layout``: per GPU the action and nvidia-smi commands, and the MIG devices the
    node ends up with. Raises MigError for a layout the node's GPUs cannot take (nothing is changed then).

    A mode change comes first and alone: its commands (instances destroyed, then `-mig`) are planned, and the
    instances are planned again from a fresh read once the new mode is current. A GPU whose mode is pending (the
    driver could not reset it) is reported with ``reset_required``: only a GPU reset or a reboot makes it current.
    Nothing is planned where the GPU already has the layout.
    """
    problems = validate_layouts(config)
    if problems:
        raise MigError("the MIG layouts are not valid: " + "; ".join(problems))
    entries = layout_entries(config, layout)
    entry_problems = [p for i, e in enumerate(entries) for p in _entry_problems(f"{layout}[{i}]", e)]
    if entry_problems:
        raise MigError("; ".join(entry_problems))
    gpus = state.get("gpus") or []
    wanted = wanted_per_gpu(entries, gpus)
    builtin = layout not in ((config or {}).get("mig-configs") or {})
    plans: list[GpuPlan] = []
    errors: list[str] = []
    for gpu in gpus:
        model = find_model(gpu["device_id"])
        spec = wanted.get(gpu["index"])
        item = GpuPlan(gpu["index"], model.name if model else None, gpu["device_id"], gpu.get("uuid"), spec)
        plans.append(item)
        # The driver's word when it answers ([N/A]: no MIG on this GPU, or not here); the table's before that.
        capable = gpu.get("mig_current") is not None if state.get("smi") else model is not None
        if spec is None:
            if builtin and capable and model is not None:
                errors.append(f"GPU {gpu['index']}: {model.name} has no layout {layout}")
            item.note = f"no entry of layout {layout} matches this GPU: left as it is"
            continue
        if not capable:
            if spec["enabled"] and not spec["devices_all"]:
                errors.append(f"GPU {gpu['index']} ({gpu.get('name') or gpu['device_id']}) does not support MIG")
            item.wanted = None
            item.note = "not MIG capable: left as it is"
            continue
        if model is None:
            errors.append(
                f"GPU {gpu['index']} ({gpu.get('name') or gpu['device_id']}) supports MIG but is not in this "
                "collection's MIG profile table, so its layout cannot be checked"
            )
            continue
        if spec["enabled"]:
            try:
                item.placements = fit(model, spec["devices"])
            except MigError as error:
                errors.append(f"GPU {gpu['index']}: {error}")
                continue
        if state.get("smi"):
            _plan_gpu(item, gpu, spec, state.get("busy") or {})
        else:
            item.action = "unknown"
            item.note = "nvidia-smi does not answer (no driver loaded yet): checked against the table only"
    if errors:
        raise MigError(f"layout {layout}: " + "; ".join(errors))
    result = [p.as_dict() for p in plans]
    changes = [p for p in plans if p.commands]
    return {
        "layout": layout,
        "ready": bool(state.get("smi")),
        "changed": bool(changes),
        "mode_change": any(p.mode_change for p in plans),
        "reset_required": [p.index for p in plans if p.reset_required],
        "busy": {str(p.index): p.busy for p in changes if p.busy},
        "gpus": result,
        "devices": node_devices(state, result),
    }


def _plan_gpu(item: GpuPlan, gpu: dict[str, Any], spec: dict[str, Any], busy: dict[str, list[str]]) -> None:
    index = gpu["index"]
    current, pending = gpu.get("mig_current"), gpu.get("mig_pending")
    counts, clean = _current_devices(gpu)
    has_instances = bool(gpu.get("instances"))
    # Compute instances first (a GPU instance with one cannot be destroyed); -dci finds nothing, and fails, where a
    # cancelled run left GPU instances without compute instances.
    has_computes = any(gi.get("cis") for gi in gpu.get("instances") or [])
    destroy = ([_smi("mig", "-i", index, "-dci")] if has_computes else []) + (
        [_smi("mig", "-i", index, "-dgi")] if has_instances else []
    )
    if spec["enabled"] != current:
        if pending == spec["enabled"] and pending is not None:
            item.action = "reset_required"
            item.reset_required = True
            item.note = (
                f"MIG mode is pending {'Enabled' if spec['enabled'] else 'Disabled'}: the driver could not reset the "
                "GPU (a process holds it, or the platform allows no reset); reset it (nvidia-smi --gpu-reset) or "
                "reboot the node"
            )
            return
        item.action = "enable" if spec["enabled"] else "disable"
        item.mode_change = True
        item.commands = [*destroy, _smi("-i", index, "-mig", 1 if spec["enabled"] else 0)]
    elif spec["enabled"]:
        # A mode change someone asked for and no reset made current yet would undo this layout at the next reset.
        revert = [_smi("-i", index, "-mig", 1)] if pending is False else []
        wanted_counts = spec["devices"]
        if counts == wanted_counts and clean and not revert:
            item.note = "the layout is already there"
            return
        item.action = "reconfigure" if has_instances else "create"
        item.commands = list(revert)
        if counts == wanted_counts and clean:
            item.action = "keep_mode"
            item.note = "a pending MIG disable is taken back; the layout is already there"
            return
        item.commands += destroy
        if item.placements:
            profiles = ",".join(name for name, _start in item.placements)
            item.commands.append(_smi("mig", "-i", index, "-cgi", profiles, "-C"))
    elif pending is True:
        item.action = "disable"
        item.commands = [_smi("-i", index, "-mig", 0)]
        item.note = "a pending MIG enable is taken back"
    else:
        item.note = "MIG is disabled, as wanted"
        return
    if gpu.get("uuid") in busy:
        item.busy = list(busy[gpu["uuid"]])


MAX_CREATION_ORDERS = 24


def creation_orders(profiles: list[str], limit: int = MAX_CREATION_ORDERS) -> list[list[str]]:
    """Orders to create a GPU's instances in: the planned one (larger first) and then, should the driver place them
    so that a later one finds no room, other distinct orders, as nvidia-mig-parted tries them
    (pkg/mig/config/config.go, iteratePermutationsUntilSuccess)."""
    orders: list[list[str]] = [list(profiles)]

    def permute(left: list[str], prefix: list[str]) -> None:
        if len(orders) >= limit:
            return
        if not left:
            if prefix not in orders:
                orders.append(prefix)
            return
        for position, name in enumerate(left):
            if name not in left[:position]:
                permute(left[:position] + left[position + 1 :], [*prefix, name])

    permute(list(profiles), [])
    return orders


def create_command(index: int, profiles: list[str]) -> list[str]:
    return _smi("mig", "-i", index, "-cgi", ",".join(profiles), "-C")


def create_instances(index: int, profiles: list[str], run) -> list[list[str]]:
    """Create a GPU's instances, trying other orders when the driver finds no room ("Insufficient Resources").

    ``run(argv)`` runs one command on the node and returns (rc, output). Between two tries, what the failed one
    created is destroyed. Returns the commands run; raises MigError when no order works.
    """
    done: list[list[str]] = []
    last = ""
    for order in creation_orders(profiles):
        argv = create_command(index, order)
        rc, output = run(argv)
        done.append(argv)
        if rc == 0:
            return done
        last = f"{' '.join(argv)} failed: {output.strip()}"
        if "Insufficient Resources" not in output:
            break
        for clear in (_smi("mig", "-i", index, "-dci"), _smi("mig", "-i", index, "-dgi")):
            rc, output = run(clear)
            done.append(clear)
            if rc != 0 and "Not Found" not in output and "No " not in output:
                raise MigError(f"{' '.join(clear)} failed: {output.strip()}")
    raise MigError(f"{last} (tried {sum(1 for argv in done if '-cgi' in argv)} orders)")


def node_devices(state: dict[str, Any], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """What the node offers once the plan is applied: GPUs without MIG, MIG devices per profile, and whether every
    GPU has MIG enabled (the single strategy needs that)."""
    full = 0
    mig: dict[str, int] = {}
    enabled = 0
    by_index = {g["index"]: g for g in state.get("gpus") or []}
    for item in gpus:
        gpu = by_index.get(item["index"], {})
        if item["mig"] is None:
            on = bool(gpu.get("mig_current"))
            devices = _current_devices(gpu)[0] if on else {}
        else:
            on, devices = item["mig"], item["devices"] or {}
        if on:
            enabled += 1
            for name, count in devices.items():
                mig[name] = mig.get(name, 0) + count
        else:
            full += 1
    return {"gpus": len(gpus), "full_gpus": full, "mig_enabled_gpus": enabled, "mig": dict(sorted(mig.items()))}


def current_devices(state: dict[str, Any]) -> dict[str, Any]:
    """What the node offers now (node_devices for a plan that leaves every GPU as it is)."""
    untouched = [{"index": g["index"], "mig": None, "devices": None} for g in state.get("gpus") or []]
    return node_devices(state, untouched)


# ---- what the device plugin will advertise -------------------------------------------------------------------------


def expected_resources(devices: dict[str, Any], strategy: str) -> dict[str, int]:
    """The extended resources (before any sharing) NVIDIA's device plugin advertises on a node with ``devices``
    (node_devices' result) under a MIG strategy. Raises MigError where the strategy cannot serve the node."""
    if strategy not in STRATEGIES:
        raise MigError(f"MIG strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    mig = {name: count for name, count in (devices.get("mig") or {}).items() if count}
    full = int(devices.get("full_gpus") or 0)
    enabled = int(devices.get("mig_enabled_gpus") or 0)
    if strategy == "none":
        if enabled:
            raise MigError(
                f"{enabled} GPU(s) have MIG enabled but the device plugin's MIG strategy is none: it would not "
                "advertise their MIG devices; use single or mixed"
            )
        return {GPU_RESOURCE: full} if full else {}
    if strategy == "single":
        if enabled and full:
            raise MigError(
                "the single MIG strategy needs MIG on every GPU of a node (GPU feature discovery labels a node with "
                "MIG enabled and disabled GPUs as invalid); use mixed"
            )
        if len(mig) > 1:
            raise MigError(f"the single MIG strategy needs one MIG profile per node, not {', '.join(mig)}; use mixed")
        if enabled and not mig:
            raise MigError("the single MIG strategy needs MIG devices on a MIG-enabled GPU (empty GPUs are invalid)")
        return {GPU_RESOURCE: sum(mig.values()) if enabled else full} if (enabled or full) else {}
    resources = {GPU_RESOURCE: full} if full else {}
    for name, count in sorted(mig.items()):
        resources[resource_name(name)] = count
    return resources


def _wants_mig(value: Any) -> bool:
    """A node's layout name (MIG on unless empty or all-disabled) or its MIG devices (a GPU with MIG enabled)."""
    if isinstance(value, dict):
        return bool(int(value.get("mig_enabled_gpus") or 0))
    return str(value or "") not in ("", "all-disabled")


def strategy_for(nodes: Any, requested: Any = "auto") -> str:
    """The device plugin's MIG strategy for a run: ``requested`` when it is none, single or mixed; for auto, mixed
    when a node wants MIG (mixed serves every layout, and GPUs without MIG beside them), else none.

    ``nodes``: the nodes' layout names (a list, or node -> name) or their MIG devices (node -> node_devices' result).
    """
    requested = str(requested or "auto")
    if requested in STRATEGIES:
        return requested
    if requested != "auto":
        raise MigError(f"the MIG strategy must be auto, none, single or mixed, not {requested!r}")
    if isinstance(nodes, dict):
        values = list(nodes.values())
    elif isinstance(nodes, (list, tuple)):
        values = list(nodes)
    else:
        raise MigError("the MIG strategy needs the nodes' layout names or MIG devices (a list or a dict)")
    return "mixed" if any(_wants_mig(v) for v in values) else "none"


def resources_by_node(devices_by_node: Any, strategy: Any) -> dict[str, dict[str, int]]:
    """Per node with a GPU in MIG mode, the resources the device plugin advertises there (before sharing), for the
    device plugin module's expected_resources. Nodes without MIG are left to its expected_gpus."""
    if not isinstance(devices_by_node, dict) or not all(isinstance(v, dict) for v in devices_by_node.values()):
        raise MigError(
            "expects a mapping of node name to its MIG devices (the gpu_mig role's gpu_mig_devices: gpus, full_gpus, "
            "mig_enabled_gpus, mig)"
        )
    result: dict[str, dict[str, int]] = {}
    problems = []
    for node, devices in sorted((str(node), devices) for node, devices in devices_by_node.items()):
        if not int(devices.get("mig_enabled_gpus") or 0):
            continue
        try:
            result[node] = expected_resources(devices, str(strategy))
        except MigError as error:
            problems.append(f"{node}: {error}")
    if problems:
        raise MigError("; ".join(problems))
    return result

# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.nvidia_device_plugin: validation of the NVIDIA device plugin's config file (version v1, as
# read by k8s-device-plugin v0.17 to v0.20) and what it means for the capacity each node should advertise.
#
# The plugin unmarshals its config leniently: a key it does not know, or a known key at the wrong level, is silently
# dropped (k8s-device-plugin#1433, #615). Everything here is pure so that it runs before any API call.

from __future__ import annotations

import json
import re

GPU_RESOURCE = "nvidia.com/gpu"
RESOURCE_PREFIX = "nvidia.com/"
SHARED_SUFFIX = ".shared"
MAX_RESOURCE_NAME_LENGTH = 63

MIG_STRATEGIES = ("none", "single", "mixed")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES = ("uuid", "index")
DEVICE_DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")

_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|\u00b5s|ms|s|m|h))+$")
_RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_MIG_UUID = re.compile(r"^MIG-([0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}|GPU-[0-9a-fA-F-]{36}/[0-9]+/[0-9]+)$")


class _Field:
    """One leaf of the schema: a kind and an optional check returning an error text."""

    def __init__(self, kind: str, choices: tuple = (), check=None):
        self.kind = kind
        self.choices = choices
        self.check = check


class _ListOf:
    def __init__(self, item):
        self.item = item


# MPS (k8s-device-plugin v0.15 and later): the plugin hands out replicas of each GPU served by NVIDIA's MPS control
# daemon, a second DaemonSet (manifests.render_mps_daemonset) on nodes labelled nvidia.com/mps.capable=true. Both find
# each other under the MPS root on the host (the chart's mps.root, /run/nvidia/mps).
MPS_ROOT_DEFAULT = "/run/nvidia/mps"
# At most 48 clients share a GPU through MPS (NVIDIA MIG User Guide, Concepts: CUDA concurrency mechanisms).
MPS_MAX_CLIENTS = 48


def _check_duration(value):
    if isinstance(value, bool):
        return "must be a duration such as 30s or 1m"
    if isinstance(value, int) and value >= 0:
        return None
    if isinstance(value, str) and _DURATION.match(value):
        return None
    return "must be a duration such as 30s or 1m"


def _check_device_list_strategy(value):
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        return "must be a string or a non-empty list of strings"
    bad = [v for v in values if v not in DEVICE_LIST_STRATEGIES]
    if bad:
        return f"unknown strategy {', '.join(bad)}; expected one of {', '.join(DEVICE_LIST_STRATEGIES)}"
    if len(set(values)) != len(values):
        return "lists a strategy twice"
    return None


def _check_string_or_list(value):
    if isinstance(value, str):
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return None
    return "must be a string or a list of strings"


def _check_channel_ids(value):
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        return "must be a list of integers"
    if value not in ([], [0]):
        return "must be [] or [0] (the plugin supports IMEX channel 0 only)"
    return None


def _check_devices(value):
    if value == "all":
        return None
    if isinstance(value, bool):
        return "must be 'all', a positive count or a list of GPU indexes, MIG indexes or UUIDs"
    if isinstance(value, int):
        return None if value > 0 else "a device count must be greater than 0"
    if isinstance(value, list) and value:
        for item in value:
            if isinstance(item, bool):
                return f"unsupported device reference {item!r}"
            if isinstance(item, int) and item >= 0:
                continue
            if isinstance(item, str) and (
                item.isdigit() or re.match(r"^[0-9]+:[0-9]+$", item) or _GPU_UUID.match(item) or _MIG_UUID.match(item)
            ):
                continue
            return f"unsupported device reference {item!r} (use a GPU index, a MIG index such as 0:1, or a UUID)"
        return None
    return "must be 'all', a positive count or a list of GPU indexes, MIG indexes or UUIDs"


def _check_resource_name(value):
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    full = value if value.startswith(RESOURCE_PREFIX) else RESOURCE_PREFIX + value
    if len(full) > MAX_RESOURCE_NAME_LENGTH:
        return f"{full} is longer than {MAX_RESOURCE_NAME_LENGTH} characters"
    short = full[len(RESOURCE_PREFIX) :]
    if "/" in short or not _RESOURCE_NAME.match(short):
        return f"{value!r} is not a valid resource name (expected nvidia.com/<lowercase name>)"
    return None


def _check_replicas(value):
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be an integer"
    if value < 2:
        return "must be at least 2 (one replica means no sharing)"
    return None


_REPLICATED_RESOURCE = {
    "name": _Field("str", check=_check_resource_name),
    "rename": _Field("str", check=_check_resource_name),
    "devices": _Field("any", check=_check_devices),
    "replicas": _Field("int", check=_check_replicas),
}

_REPLICATED_RESOURCES = {
    "renameByDefault": _Field("bool"),
    "failRequestsGreaterThanOne": _Field("bool"),
    "resources": _ListOf(_REPLICATED_RESOURCE),
}

_NAMED_PATTERN = {
    "pattern": _Field("str"),
    "name": _Field("str", check=_check_resource_name),
}

SCHEMA = {
    "version": _Field("str"),
    "flags": {
        "migStrategy": _Field("enum", MIG_STRATEGIES),
        "failOnInitError": _Field("bool"),
        "restartOnDeviceUnhealthy": _Field("bool"),
        "mpsRoot": _Field("str"),
        "nvidiaDriverRoot": _Field("str"),
        "nvidiaDevRoot": _Field("str"),
        "gdrcopyEnabled": _Field("bool"),
        "gdsEnabled": _Field("bool"),
        "mofedEnabled": _Field("bool"),
        "useNodeFeatureAPI": _Field("bool"),
        "deviceDiscoveryStrategy": _Field("enum", DEVICE_DISCOVERY_STRATEGIES),
        "plugin": {
            "passDeviceSpecs": _Field("bool"),
            "deviceListStrategy": _Field("any", check=_check_device_list_strategy),
            "deviceIDStrategy": _Field("enum", DEVICE_ID_STRATEGIES),
            "cdiAnnotationPrefix": _Field("str"),
            "nvidiaCTKPath": _Field("str"),
            "containerDriverRoot": _Field("str"),
            "kubeletSocket": _Field("str"),
            "cdiFeatureFlags": _Field("any", check=_check_string_or_list),
        },
        "gfd": {
            "oneshot": _Field("bool"),
            "noTimestamp": _Field("bool"),
            "sleepInterval": _Field("any", check=_check_duration),
            "outputFile": _Field("str"),
            "machineTypeFile": _Field("str"),
        },
    },
    "resources": {
        "gpus": _ListOf(_NAMED_PATTERN),
        "mig": _ListOf(_NAMED_PATTERN),
    },
    "sharing": {
        "timeSlicing": _REPLICATED_RESOURCES,
        "mps": _REPLICATED_RESOURCES,
    },
    "imex": {
        "channelIDs": _Field("any", check=_check_channel_ids),
        "required": _Field("bool"),
    },
}


def _index_known_paths(schema, prefix: str, index: dict) -> dict:
    for key, sub in schema.items():
        path = f"{prefix}.{key}" if prefix else key
        index.setdefault(key, []).append(path)
        if isinstance(sub, dict):
            _index_known_paths(sub, path, index)
        elif isinstance(sub, _ListOf) and isinstance(sub.item, dict):
            _index_known_paths(sub.item, path + "[]", index)
    return index


_KNOWN_PATHS = _index_known_paths(SCHEMA, "", {})
_KNOWN_BY_LOWER = {key.lower(): key for key in _KNOWN_PATHS}


def _unknown_key_problem(path: str, key: str, allowed) -> str:
    where = f"{path}.{key}" if path else key
    level = f"under {path}" if path else "at the top level"
    elsewhere = _KNOWN_PATHS.get(key)
    if elsewhere:
        return f"{where}: '{key}' is not valid {level}; it belongs at {' or '.join(elsewhere)}"
    near = _KNOWN_BY_LOWER.get(key.lower().replace("_", "").replace("-", ""))
    if near and near in allowed:
        return f"{where}: unknown key '{key}'; did you mean '{near}'?"
    return f"{where}: unknown key '{key}' (known {level}: {', '.join(sorted(allowed))})"


def _type_problem(field: _Field, value):
    if field.kind == "bool" and not isinstance(value, bool):
        return "must be true or false"
    if field.kind == "str" and not isinstance(value, str):
        return "must be a string"
    if field.kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        return "must be an integer"
    if field.kind == "enum" and value not in field.choices:
        return f"must be one of {', '.join(field.choices)}, not {value!r}"
    if field.check is not None:
        return field.check(value)
    return None


def _walk(schema: dict, data, path: str, problems: list) -> None:
    if not isinstance(data, dict):
        problems.append(f"{path or 'config'}: must be a mapping")
        return
    for key, value in data.items():
        if not isinstance(key, str) or key not in schema:
            problems.append(_unknown_key_problem(path, str(key), schema.keys()))
            continue
        sub = schema[key]
        where = f"{path}.{key}" if path else key
        if isinstance(sub, dict):
            _walk(sub, value, where, problems)
        elif isinstance(sub, _ListOf):
            if not isinstance(value, list):
                problems.append(f"{where}: must be a list")
                continue
            for position, item in enumerate(value):
                _walk(sub.item, item, f"{where}[{position}]", problems)
        else:
            problem = _type_problem(sub, value)
            if problem:
                problems.append(f"{where}: {problem}")


def _full_resource_name(name: str) -> str:
    return name if name.startswith(RESOURCE_PREFIX) else RESOURCE_PREFIX + name


def _sharing_section(config: dict, name: str):
    sharing = config.get("sharing")
    if not isinstance(sharing, dict):
        return None
    section = sharing.get(name)
    return section if isinstance(section, dict) else None


def validate_config(config) -> list[str]:
    """Check a plugin config; returns the problems found (empty when it is valid)."""
    if not isinstance(config, dict):
        return ["config: must be a mapping (the device plugin config file, version v1)"]
    problems: list[str] = []
    if config.get("version") != "v1":
        problems.append(f"version: must be 'v1' (got {config.get('version')!r})")
    _walk(SCHEMA, config, "", problems)

    flags = config.get("flags") if isinstance(config.get("flags"), dict) else {}
    mig_strategy = flags.get("migStrategy", "none")
    time_slicing = _sharing_section(config, "timeSlicing")
    mps = _sharing_section(config, "mps")
    if time_slicing is not None and mps is not None:
        problems.append("sharing: timeSlicing and mps cannot both be set; choose one sharing strategy")
    if mps is not None:
        problems.extend(_mps_problems(mps, mig_strategy, flags))
    for label, section in (("timeSlicing", time_slicing), ("mps", mps)):
        if section is None:
            continue
        resources = section.get("resources")
        if not isinstance(resources, list) or not resources:
            problems.append(f"sharing.{label}.resources: at least one resource to share is required")
            continue
        seen = set()
        for position, resource in enumerate(resources):
            if not isinstance(resource, dict):
                continue
            where = f"sharing.{label}.resources[{position}]"
            if "name" not in resource:
                problems.append(f"{where}.name: is required")
            if "replicas" not in resource:
                problems.append(f"{where}.replicas: is required")
            name = resource.get("name")
            if isinstance(name, str) and name:
                full = _full_resource_name(name)
                if full in seen:
                    problems.append(f"{where}.name: {full} is listed twice")
                seen.add(full)
                if full.startswith(RESOURCE_PREFIX + "mig-") and mig_strategy != "mixed":
                    problems.append(
                        f"{where}.name: {full} exists only with flags.migStrategy mixed (it is {mig_strategy})"
                    )
    for section in ("gpus", "mig"):
        resources = config.get("resources")
        if isinstance(resources, dict) and isinstance(resources.get(section), list):
            for position, entry in enumerate(resources[section]):
                if isinstance(entry, dict):
                    for required in ("pattern", "name"):
                        if required not in entry:
                            problems.append(f"resources.{section}[{position}].{required}: is required")
    return problems


def _mps_problems(mps: dict, mig_strategy, flags: dict) -> list:
    """Where NVIDIA's plugin refuses an MPS config, or silently does something else than it says."""
    problems = []
    if mig_strategy in ("single", "mixed"):
        # cmd/nvidia-device-plugin/main.go refuses mixed with MPS; internal/plugin/mps.go refuses MPS for MIG devices.
        problems.append(
            f"sharing.mps: MPS cannot be combined with MIG (flags.migStrategy is {mig_strategy}): the plugin refuses "
            "MPS for MIG devices; use MPS on nodes without MIG, or time-slicing"
        )
    if mps.get("failRequestsGreaterThanOne") is False:
        # api/config/v1/config.go (v0.17 to v0.20) sets it to true whatever the file says.
        problems.append(
            "sharing.mps.failRequestsGreaterThanOne: false is ignored by the plugin (v0.17 to v0.20 set it to true "
            "for MPS): a pod asking for more than one shared GPU is always refused; leave it out or set it to true"
        )
    root = flags.get("mpsRoot")
    if isinstance(root, str) and not root.startswith("/"):
        problems.append(f"flags.mpsRoot: must be an absolute path on the node, not {root!r}")
    for position, resource in enumerate(mps.get("resources") or []):
        if isinstance(resource, dict) and "name" in resource:
            name = _full_resource_name(str(resource["name"]))
            if name != GPU_RESOURCE:
                problems.append(
                    f"sharing.mps.resources[{position}].name: MPS shares full GPUs only ({GPU_RESOURCE}), not {name}"
                )
    return problems


def mps_enabled(config: dict | None) -> bool:
    return _sharing_section(config or {}, "mps") is not None


def mps_root(config: dict | None) -> str:
    """Where the plugin and the MPS control daemon meet on the host: flags.mpsRoot, else the chart's default."""
    flags = (config or {}).get("flags")
    root = flags.get("mpsRoot") if isinstance(flags, dict) else None
    return (root if isinstance(root, str) and root else MPS_ROOT_DEFAULT).rstrip("/") or "/"


def mig_strategy(config: dict | None) -> str:
    flags = (config or {}).get("flags")
    strategy = flags.get("migStrategy") if isinstance(flags, dict) else None
    return strategy if strategy in MIG_STRATEGIES else "none"


def config_warnings(config: dict) -> list[str]:
    """Settings that are valid but that the plugin (v0.17 to v0.20) ignores at run time."""
    warnings = []
    resources = config.get("resources")
    if isinstance(resources, dict) and (resources.get("gpus") or resources.get("mig")):
        warnings.append(
            "config resources.gpus/resources.mig: the device plugin ignores custom resource names "
            "('not yet supported in the config. Ignoring...')"
        )
    for label in ("timeSlicing", "mps"):
        section = _sharing_section(config, label)
        for resource in (section or {}).get("resources") or []:
            if not isinstance(resource, dict):
                continue
            if "rename" in resource:
                warnings.append(
                    f"config sharing.{label}.resources[].rename: the device plugin ignores per-resource renames; "
                    "use renameByDefault"
                )
            if "devices" in resource and resource.get("devices") != "all":
                warnings.append(
                    f"config sharing.{label}.resources[].devices: the device plugin shares all devices and ignores "
                    "this setting"
                )
    mps = _sharing_section(config, "mps")
    for resource in (mps or {}).get("resources") or []:
        replicas = resource.get("replicas") if isinstance(resource, dict) else None
        if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > MPS_MAX_CLIENTS:
            warnings.append(
                f"config sharing.mps: {replicas} replicas per GPU, but MPS serves at most {MPS_MAX_CLIENTS} clients "
                "per GPU: pods beyond that cannot connect to the MPS server"
            )
    return sorted(set(warnings))


def render_config(config: dict) -> str:
    """The config file's text. JSON is valid YAML for the plugin's parser; sorted keys keep it stable across runs."""
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def capacity_plan(config: dict | None) -> dict:
    """What a node should advertise under this config.

    Returns a dict: ``resource`` (the extended resource carrying full GPUs), ``replicas`` (how many schedulable
    units each physical GPU becomes), ``exact`` (whether physical GPU count x replicas predicts the capacity),
    ``mig_strategy``, ``sharing`` (None, time-slicing or mps), ``mig_resources`` (whether nvidia.com/mig-*
    resources count as GPU capacity) and ``shared`` (each shared resource: its replicas and the name it is
    advertised under, ``<name>.shared`` with renameByDefault).
    """
    config = config or {}
    flags = config.get("flags") if isinstance(config.get("flags"), dict) else {}
    mig_strategy = flags.get("migStrategy", "none")
    plan = {
        "resource": GPU_RESOURCE,
        "replicas": 1,
        "exact": True,
        "mig_strategy": mig_strategy,
        "sharing": None,
        "mig_resources": mig_strategy == "mixed",
        "shared": {},
    }
    if mig_strategy in ("single", "mixed"):
        # With MIG the count follows the MIG layout of each GPU, which the physical GPU count does not determine.
        plan["exact"] = False
    for label, strategy in (("timeSlicing", "time-slicing"), ("mps", "mps")):
        section = _sharing_section(config, label)
        if section is None:
            continue
        for resource in section.get("resources") or []:
            if isinstance(resource, dict) and resource.get("name"):
                name = _full_resource_name(str(resource["name"]))
                plan["shared"][name] = {
                    "replicas": int(resource.get("replicas", 1)),
                    "as": name + SHARED_SUFFIX if section.get("renameByDefault") else name,
                }
            if isinstance(resource, dict) and _full_resource_name(str(resource.get("name", ""))) == GPU_RESOURCE:
                plan["sharing"] = strategy
                plan["replicas"] = int(resource.get("replicas", 1))
                if section.get("renameByDefault"):
                    plan["resource"] = GPU_RESOURCE + SHARED_SUFFIX
    return plan


def explicit_fail_on_init_error(config: dict | None) -> bool:
    flags = (config or {}).get("flags")
    return isinstance(flags, dict) and "failOnInitError" in flags


def advertised(plan: dict, resources: dict) -> dict:
    """Resource counts before sharing (``{"nvidia.com/mig-1g.10gb": 2}``) as the plugin advertises them under the
    plan's sharing: each shared resource times its replicas, under its shared name with renameByDefault."""
    result: dict = {}
    for name, count in resources.items():
        full = _full_resource_name(str(name))
        shared = (plan.get("shared") or {}).get(full)
        if shared:
            full, count = shared["as"], int(count) * shared["replicas"]
        result[full] = result.get(full, 0) + int(count)
    return result

# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of kubegpu.node.kubelet_feature_gates, not a public API: it can change at any time.
#
# What each kubelet release knows of the feature gates this collection touches: the stage a gate is at from a given
# minor release on, its default there, whether it is locked to that default, and the Kubernetes change that says so.
# A gate is unknown before its first stage and from its "removed" stage on (the kubelet then exits at start with
# "unrecognized feature gate: NAME"). Users extend this table with kubelet_feature_gate_table (same shape).

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Stage:
    since: tuple[int, int]
    stage: str  # alpha | beta | ga | deprecated | removed
    default: bool
    locked: bool
    source: str


STAGES = ("alpha", "beta", "ga", "deprecated", "removed")

# Each entry: (since minor release, stage, default, locked, source).
TABLE: dict[str, list[tuple[str, str, bool, bool, str]]] = {
    "DevicePlugins": [
        ("1.8", "alpha", False, False, "pkg/features/kube_features.go at v1.8.0: DevicePlugins alpha, off"),
        ("1.10", "beta", True, False, "kubernetes/kubernetes v1.10.0 CHANGELOG: DevicePlugins beta, on by default"),
        ("1.26", "ga", True, True, "kubernetes/kubernetes v1.26.0 CHANGELOG: DevicePlugins GA, locked to true"),
        ("1.28", "removed", False, False, "kubernetes/kubernetes#117656 (v1.28.0): DevicePlugins removed"),
    ],
    "Accelerators": [
        (
            "1.6",
            "alpha",
            False,
            False,
            "pkg/features/kube_features.go at v1.6.0: Accelerators alpha, off (alpha.kubernetes.io/nvidia-gpu)",
        ),
        ("1.10", "deprecated", False, False, "kubernetes/kubernetes v1.10.0 CHANGELOG: Accelerators deprecated"),
        ("1.11", "removed", False, False, "kubernetes/kubernetes#61498 (v1.11.0): Accelerators removed"),
    ],
    "DevicePluginCDIDevices": [
        (
            "1.28",
            "alpha",
            False,
            False,
            "kubernetes/kubernetes v1.28.0 CHANGELOG: DevicePluginCDIDevices alpha (KEP 4009)",
        ),
        (
            "1.29",
            "beta",
            True,
            False,
            "kubernetes/kubernetes v1.29.0 CHANGELOG: DevicePluginCDIDevices beta, on by default",
        ),
        ("1.31", "ga", True, True, "kubernetes/kubernetes#123315 and #125687 (v1.31.0): GA, locked to true"),
        ("1.34", "removed", False, False, "kubernetes/kubernetes#132083 (v1.34.0): DevicePluginCDIDevices removed"),
    ],
}


class GateTableError(ValueError):
    """An entry of the gate table (most likely one a user added) is malformed."""


def parse_minor(text: str) -> tuple[int, int]:
    """'1.30', 'v1.30.2', '1.30.2+k3s1' -> (1, 30)."""
    cleaned = text.strip().lstrip("v")
    parts = cleaned.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or "x")
    except (IndexError, ValueError):
        raise GateTableError(f"{text!r} is not a Kubernetes version (expected MAJOR.MINOR, such as 1.30)") from None


def build_table(extra: dict[str, Any] | None = None) -> dict[str, list[Stage]]:
    """The built-in table, with the user's entries (same shape, as dicts or tuples) replacing whole gates."""
    merged: dict[str, list[Any]] = {name: list(stages) for name, stages in TABLE.items()}
    for name, stages in (extra or {}).items():
        if not isinstance(stages, list) or not stages:
            raise GateTableError(f"kubelet_feature_gate_table: {name} needs a list of stages")
        merged[name] = stages
    table: dict[str, list[Stage]] = {}
    for name, stages in merged.items():
        parsed = [_stage(name, entry) for entry in stages]
        table[name] = sorted(parsed, key=lambda s: s.since)
    return table


def _stage(name: str, entry: Any) -> Stage:
    if isinstance(entry, dict):
        try:
            since, stage = str(entry["since"]), str(entry["stage"])
        except KeyError as exc:
            raise GateTableError(f"kubelet_feature_gate_table: a stage of {name} has no {exc.args[0]}") from None
        default, locked, source = entry.get("default", False), entry.get("locked", False), entry.get("source", "")
    else:
        since, stage, default, locked, source = entry
    if stage not in STAGES:
        raise GateTableError(f"kubelet_feature_gate_table: {name} stage {stage!r} is not one of {', '.join(STAGES)}")
    if not isinstance(default, bool) or not isinstance(locked, bool):
        raise GateTableError(f"kubelet_feature_gate_table: {name} {since}: default and locked must be true or false")
    return Stage(parse_minor(since), stage, default, locked, str(source))


def stage_at(table: dict[str, list[Stage]], name: str, version: tuple[int, int]) -> Stage | None:
    """The stage of `name` in kubelet `version`; None when that kubelet does not know the gate."""
    current = None
    for stage in table.get(name, []):
        if stage.since <= version:
            current = stage
    if current is None or current.stage == "removed":
        return None
    return current


def removal(table: dict[str, list[Stage]], name: str, version: tuple[int, int]) -> Stage | None:
    """The 'removed' stage in force at `version`, if the gate was removed by then (for the message)."""
    current = None
    for stage in table.get(name, []):
        if stage.since <= version:
            current = stage
    return current if current is not None and current.stage == "removed" else None

# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private, not a public API: the decisions of roles/_common, the node layer every role of this collection starts its
# preflight with (the action kubegpu.node.node_layer): who may use it, the node's Python, the facts the roles read,
# the chain of a role's OS variable files, the renamed variables. Pure functions; the action does the node's part.

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

# ansible-core 2.16 to 2.19 run modules on Python 3.8 or later on the node (2.19: 3.8 to 3.14).
PYTHON_MIN = (3, 8)

# The facts the roles read; gathered (the min subset) only when one is missing.
FACTS = ("os_family", "distribution", "distribution_major_version", "distribution_version", "architecture", "kernel")

COLLECTION_PREFIX = "kubegpu.node."
# The one caller that is not a role: the playbook kubegpu.node.site, which runs the layer of all its roles in one call
# (its preflight play), with the roles folder of this collection.
SITE = "kubegpu.node.site"

# What a refused caller is told.
INTERNAL = (
    "kubegpu.node._common is internal: the roles of kubegpu.node include it with their own variables. Run one of them "
    "(kubegpu.node.nvidia_driver, nvidia_container_toolkit, container_runtime, kubelet) or playbook kubegpu.node.site "
    "instead."
)

_BOOL_WORDS = frozenset(["true", "false", "yes", "no", "on", "off", "1", "0"])


def refusal(caller: str, caller_path: str, own_path: str) -> str | None:
    """Why the layer refuses to run for this caller (None when it may): only a role of this collection imports it,
    by its collection name or from the same roles folder (a checkout used as a roles path)."""
    if not caller:
        return INTERNAL
    if caller.startswith(COLLECTION_PREFIX):
        return None
    if caller_path and own_path and os.path.dirname(caller_path.rstrip("/")) == os.path.dirname(own_path.rstrip("/")):
        return None
    return INTERNAL


def site_refusal(caller: str, roles: Sequence[str], own_roles: str, isdir: Any = os.path.isdir) -> str | None:
    """Why the layer refuses a call for several roles at once (None when it may): only the playbook kubegpu.node.site
    makes one, for roles of this collection (folders of its own roles folder, not the internal ones)."""
    if caller != SITE:
        return INTERNAL
    unknown = [
        role for role in roles if role.startswith("_") or "/" in role or not isdir(os.path.join(own_roles, role))
    ]
    if unknown:
        return f"{', '.join(unknown)}: not a role of kubegpu.node whose node layer kubegpu.node.site runs."
    return None


def renames_refusal(caller: str, renamed: list[Any], applied: bool) -> str | None:
    """Why the layer refuses a role with renamed variables that imported roles/_common's node.yml, which does not set
    the new names (None when it may): the old names would be announced and then not used."""
    if not renamed or applied:
        return None
    names = ", ".join(str(item.get("old", "?")) for item in renamed if isinstance(item, Mapping))
    return (
        f"{caller} has renamed variables ({names}): its preflight must import kubegpu.node._common with "
        "tasks_from: node_renamed, which sets the new names from the old ones (node sets none)."
    )


def short_name(caller: str) -> str:
    """The role's own name: kubegpu.node.nvidia_driver -> nvidia_driver (its internal variables' prefix)."""
    return caller[len(COLLECTION_PREFIX) :] if caller.startswith(COLLECTION_PREFIX) else caller


def python_argv(interpreter: str) -> list[str]:
    """The command that prints the node's Python as '3.11 /usr/bin/python3', run through the node's shell as `raw`
    runs one (NodeAction.command): no module, since a module needs the Python this checks."""
    return [
        interpreter,
        "-c",
        'import sys; print("%d.%d %s" % (sys.version_info[0], sys.version_info[1], sys.executable))',
    ]


def python_refusal(host: str, caller: str, rc: int, stdout: str, stderr: str) -> str | None:
    """The refusal for a Python ansible-core cannot use on the node (None when it can)."""
    said = stdout.strip()
    minimum = "%d.%d" % PYTHON_MIN
    if rc == 0:
        match = re.match(r"(\d+)\.(\d+)(\s|$)", said)
        if match and (int(match.group(1)), int(match.group(2))) >= PYTHON_MIN:
            return None
        found = f"it has Python {said}"
    else:
        found = "python3 did not run: " + ((stderr or "").strip() or said)
    return (
        f"{host} has no Python {minimum} or later ({found}). ansible-core needs Python {minimum} or later on managed "
        f"nodes ({caller}). Install one (for example python3.9 on RHEL 8) and point ansible_python_interpreter at it. "
        "Nothing was changed."
    )


def missing_facts(facts: Mapping[str, Any]) -> list[str]:
    """The facts the roles read that are not there yet."""
    return [name for name in FACTS if name not in facts]


def os_files(os_dir: str, facts: Mapping[str, Any], exists: Any = os.path.isfile) -> list[str]:
    """The role's OS variable files to load, in order: default.yml, then the first found of distribution-major,
    distribution, os_family (devsec.hardening's order), which overrides it. Either may be missing."""
    chain = [
        f"{facts.get('distribution', '')}-{facts.get('distribution_major_version', '')}.yml",
        f"{facts.get('distribution', '')}.yml",
        f"{facts.get('os_family', '')}.yml",
    ]
    found = [os.path.join(os_dir, "default.yml")] if exists(os.path.join(os_dir, "default.yml")) else []
    for name in chain:
        path = os.path.join(os_dir, name)
        if exists(path):
            return [*found, path]
    return found


def untested_note(facts: Mapping[str, Any], caller: str) -> str:
    return (
        f"{facts.get('distribution', '')} {facts.get('distribution_version', '')} is not among the systems this "
        f"collection's CI runs {caller} on; it is expected to work (see tests/README.md)."
    )


def fits(kind: str, value: Any) -> bool:
    """Whether an old name's value has the new name's type (else it is another tool's setting of the same name)."""
    if kind == "raw":
        return True
    if kind == "dict":
        return isinstance(value, Mapping)
    if kind == "list":
        return isinstance(value, Sequence) and not isinstance(value, (str, bytes))
    if kind == "bool":
        return isinstance(value, bool) or str(value).lower() in _BOOL_WORDS
    if kind in ("str", "path"):
        return isinstance(value, str)
    return False


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Mapping):
        return "dict"
    if isinstance(value, (str, bytes)):
        return "str"
    if isinstance(value, Sequence):
        return "list"
    return type(value).__name__


def renamed(
    table: Sequence[Mapping[str, Any]], given: Mapping[str, Any], caller: str
) -> tuple[list[dict[str, str]], list[str]]:
    """From a role's table of renamed variables ({old, new, type, removed_in}) and the old names set (with their
    values): those whose value is used for the new name, and what to say about each old name set. An old name set to
    another shape is someone else's setting of the same name (kubespray's kubelet_feature_gates is a list) and is
    left alone."""
    used: list[dict[str, str]] = []
    messages: list[str] = []
    for row in table:
        old, new = str(row["old"]), str(row["new"])
        if old not in given:
            continue
        if fits(str(row["type"]), given[old]):
            used.append({"old": old, "new": new})
            messages.append(
                f"DEPRECATED: {old} is the old name of {new} ({caller}), removed in {row.get('removed_in', '')}; its "
                f"value was used for {new}. Rename it in your inventory."
            )
        else:
            messages.append(
                f"{old} is set to a {_kind(given[old])}, not the {row['type']} that {caller} read under that name "
                f"before it became {new}: it is another tool's setting (kubespray or DeepOps use the name) and is "
                f"left alone. Set {new} for this role."
            )
    return used, messages

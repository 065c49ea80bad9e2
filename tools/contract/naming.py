"""The naming table (docs/naming.md) enforced on every public variable of the roles and of site.yml.

docs/naming.md holds the rules as tables, read here: the concepts every role names the same way (name, type, values),
which roles have `state: absent` (or why not), the names shared with kubespray or DeepOps on purpose, the renamed
names still read, and the dated list of names still to rename. Their variable names come from
tests/unit/tools/fixtures/foreign_variables.json (tools/foreign_variables.py).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DOC = Path("docs") / "naming.md"
FOREIGN = Path("tests") / "unit" / "tools" / "fixtures" / "foreign_variables.json"
_CELL = re.compile(r"`([^`]+)`")

# How each concept of the table is recognised in an option (role name, option name, option spec).
DETECTORS: dict[str, Callable[[str, str, Mapping[str, Any]], bool]] = {
    "state": lambda role, name, spec: name == f"{role}_state",
    "repository": lambda role, name, spec: bool(re.search(r"_repo(_url)?$", name)) or name.endswith("_repository_url"),
    "repository key": lambda role, name, spec: name.endswith("_key_url"),
    "repository key fingerprints": lambda role, name, spec: "fingerprint" in name,
    "CDI switch": lambda role, name, spec: spec.get("type") == "bool" and "cdi" in name.split("_"),
    "restart knob": lambda role, name, spec: name.endswith("_restart"),
    "reboot knob": lambda role, name, spec: name.endswith("_reboot"),
    "state directory": lambda role, name, spec: name.endswith("_state_dir"),
}


def tables(text: str) -> dict[str, list[dict[str, str]]]:
    """Each Markdown table of the page under its heading's title, as rows of {column: cell}."""
    found: dict[str, list[dict[str, str]]] = {}
    heading = ""
    header: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            heading, header = line.lstrip("#").strip(), None
            continue
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            found.setdefault(heading, [])
        elif not all(set(cell) <= {"-", ":"} for cell in cells):
            found[heading].append(dict(zip(header, cells)))
    return found


def _code(cell: str) -> list[str]:
    return _CELL.findall(cell)


@dataclass
class Naming:
    concepts: dict[str, dict[str, Any]]
    absent: dict[str, tuple[bool, str]]
    shared: set[str]
    renamed: dict[str, str]
    pending: dict[str, datetime.date]
    foreign: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> Naming:
        page = tables((root / DOC).read_text())
        concepts = {}
        for row in page.get("Concepts every role names the same way", []):
            type_cell = row["type"].split(" of ")
            concepts[row["concept"]] = {
                "name": _code(row["name"])[0],
                "type": type_cell[0],
                "elements": type_cell[1] if len(type_cell) > 1 else None,
                "choices": _code(row["values"]) or None,
            }
        absent = {
            _code(row["role"])[0]: (row["absent"] == "yes", row["why not"]) for row in page.get("`state: absent`", [])
        }
        shared = {_code(row["variable"])[0] for row in page.get("Shared on purpose", [])}
        renamed = {
            _code(row["old name"])[0]: _code(row["new name"])[0]
            for title, rows in page.items()
            if title.startswith("Renamed")
            for row in rows
        }
        pending = {
            _code(row["variable"])[0]: datetime.date.fromisoformat(row["until"])
            for row in page.get("Names still to rename", [])
        }
        foreign_file = root / FOREIGN
        foreign = json.loads(foreign_file.read_text())["variables"] if foreign_file.is_file() else {}
        return cls(concepts, absent, shared, renamed, pending, foreign)


def role_problems(naming: Naming, role: str, options: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Problems per option name (the role's own `state` rule under the name `<role>_state`)."""
    problems: dict[str, list[str]] = {}
    for name, spec in options.items():
        spec = spec or {}
        if name in naming.renamed:
            continue
        for concept, rule in naming.concepts.items():
            detect = DETECTORS.get(concept)
            if detect is None or not detect(role, name, spec):
                continue
            canonical = rule["name"].replace("<role>", role)
            wrong: list[str] = []
            if name != canonical:
                wrong.append(f"is a {concept}: name it {canonical}")
            if spec.get("type") != rule["type"]:
                wrong.append(f"is a {concept}: type {rule['type']}, not {spec.get('type')}")
            if rule["elements"] and spec.get("elements") != rule["elements"]:
                wrong.append(f"is a {concept}: elements {rule['elements']}")
            if rule["choices"] and list(spec.get("choices") or []) != rule["choices"]:
                wrong.append(f"is a {concept}: choices {', '.join(rule['choices'])}")
            if wrong:
                problems.setdefault(name, []).extend(wrong)
    state = f"{role}_state"
    has_absent = "absent" in ((options.get(state) or {}).get("choices") or [])
    documented = naming.absent.get(role)
    if documented is None:
        problems.setdefault(state, []).append(f"role {role} is not in the `state: absent` table of {DOC}")
    elif documented[0] != has_absent:
        problems.setdefault(state, []).append(
            f"the `state: absent` table says {'yes' if documented[0] else 'no'} for {role}, the specs "
            f"{'have' if has_absent else 'have no'} {state}: absent"
        )
    elif not has_absent and not documented[1].strip():
        problems.setdefault(state, []).append(f"{role} has no state absent and {DOC} does not say why")
    return problems


def collision(naming: Naming, name: str, our_type: str | None) -> str | None:
    places = naming.foreign.get(name)
    if not places:
        return None
    theirs = {place.split(":")[2] for place in places}
    where = "; ".join(places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3 else "")
    if name in naming.shared:
        ours = {"path": "str", "int": "number", "float": "number"}.get(our_type or "", our_type)
        if theirs - {ours, "unknown", "none"}:
            return f"is shared on purpose, but theirs is {', '.join(sorted(theirs))} and ours {our_type} ({where})"
        return None
    return f"is also kubespray's or DeepOps' variable ({where}): an inventory of theirs sets it"


def check(root: Path, roles: Mapping[str, Mapping[str, Mapping[str, Any]]], site: Mapping[str, Any]) -> list[str]:
    """roles: role name -> its options (every entry point's); site: site.yml's options."""
    naming = Naming.load(root)
    today = datetime.date.today()
    found: dict[str, list[str]] = {}
    for role, options in roles.items():
        for name, problems in role_problems(naming, role, options).items():
            found.setdefault(name, []).extend(problems)
        for name, spec in options.items():
            if name in naming.renamed:
                continue
            problem = collision(naming, name, (spec or {}).get("type"))
            if problem:
                found.setdefault(name, []).append(problem)
    for name, spec in site.items():
        problem = collision(naming, name, (spec or {}).get("type"))
        if problem:
            found.setdefault(name, []).append(problem)
    messages: list[str] = []
    for name, problems in sorted(found.items()):
        until = naming.pending.get(name)
        if until is not None and today <= until:
            continue
        expired = f" (its rename was due {until}: {DOC})" if until is not None else ""
        messages.append(f"{name}: {'; '.join(problems)}{expired}")
    for name in sorted(naming.pending):
        if name not in found:
            messages.append(f"{DOC}: {name} is listed as still to rename, but breaks no rule now; take it off the list")
    for old, new in sorted(naming.renamed.items()):
        owner = next((role for role, options in roles.items() if new in options), None)
        if owner is None:
            messages.append(f"{DOC}: {old} was renamed to {new}, which no role has")
            continue
        if old not in roles[owner] or "eprecated" not in str((roles[owner][old] or {}).get("description", "")):
            messages.append(f"{owner}: the old name {old} must stay an option of its specs, described as deprecated")
        mapped = _renamed_in_vars(root, owner)
        if mapped.get(old) != new:
            messages.append(
                f"{owner}: vars/main.yml's __{owner}_renamed must map {old} to {new} (roles/_common reads it)"
            )
    return messages


def _renamed_in_vars(root: Path, role: str) -> dict[str, str]:
    path = root / "roles" / role / "vars" / "main.yml"
    data = (yaml.safe_load(path.read_text()) if path.is_file() else None) or {}
    return {entry["old"]: entry["new"] for entry in data.get(f"__{role}_renamed") or [] if isinstance(entry, dict)}

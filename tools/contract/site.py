"""site.yml's own variables: each one the playbooks read is in playbooks/vars/site_argument_specs.yml and README.md."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from jinja2 import nodes

from . import booleans

SPECS = Path("playbooks") / "vars" / "site_argument_specs.yml"
PREFIX = "kubegpu_"
SET_FACT = {"set_fact", "ansible.builtin.set_fact"}


def options(root: Path) -> dict[str, dict[str, Any]]:
    data = yaml.safe_load((root / SPECS).read_text()) or {}
    return ((data.get("argument_specs") or {}).get("site") or {}).get("options") or {}


def _assigned(value: Any) -> set[str]:
    """Names the playbooks set themselves (set_fact keys, register): outputs, not the user's inputs."""
    found: set[str] = set()
    if isinstance(value, list):
        for item in value:
            found |= _assigned(item)
    elif isinstance(value, dict):
        if isinstance(value.get("register"), str):
            found.add(value["register"])
        for key in SET_FACT & set(value):
            if isinstance(value[key], dict):
                found |= set(value[key])
        for item in value.values():
            found |= _assigned(item)
    return found


def read_names(root: Path) -> dict[str, str]:
    """Each kubegpu_* name the playbooks read in a Jinja expression, with one place that reads it."""
    found: dict[str, str] = {}
    for expression in booleans.file_expressions(root):
        if not expression.where.startswith("playbooks/") or PREFIX not in expression.text:
            continue
        tree = booleans.parse(expression.text, expression.bare)
        if tree is None:
            continue
        for node in tree.find_all(nodes.Name):
            if node.ctx == "load" and node.name.startswith(PREFIX):
                found.setdefault(node.name, expression.where)
    return found


def documented_names(readme: str) -> set[str]:
    """Names README.md shows in backticks, `kubegpu_x` or, after one in the same line, a shortened `_y` of it."""
    found: set[str] = set()
    for line in readme.splitlines():
        tokens = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", line)
        full = [t for t in tokens if t.startswith(PREFIX)]
        found |= set(full)
        for short in (t for t in tokens if t.startswith("_")):
            for name in full:
                parts = name.split("_")
                found |= {"_".join(parts[:i]) + short for i in range(1, len(parts))}
    return found


def check(root: Path) -> list[str]:
    specs = options(root)
    outputs: set[str] = set()
    for path in sorted((root / "playbooks").rglob("*.yml")):
        outputs |= _assigned(yaml.safe_load(path.read_text()))
    problems = [
        f"{where}: {name} is read by the playbook but is not in {SPECS} (add it there, and to README.md's "
        "site.yml variables)"
        for name, where in sorted(read_names(root).items())
        if name not in specs and name not in outputs
    ]
    documented = documented_names((root / "README.md").read_text())
    for name in sorted(specs):
        if name not in documented:
            problems.append(f"{SPECS}: {name} is not documented in README.md (site.yml variables)")
    for name, spec in sorted(specs.items()):
        if not name.startswith(PREFIX):
            problems.append(f"{SPECS}: {name} does not start with {PREFIX}")
        if (spec or {}).get("type") == "list" and "elements" not in spec:
            problems.append(f"{SPECS}: list option {name} has no 'elements'")
    return problems

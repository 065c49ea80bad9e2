"""Every `version_added` names a version this collection has: one released (changelogs/changelog.yaml) or galaxy.yml's.

A plugin documented as added in 0.3.0 while galaxy.yml builds 0.1.0 tells a user it is not in the release they have.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

_VERSION_ADDED = re.compile(r"^\s*version_added:\s*['\"]?([^'\"\s#]+)", re.M)


def known_versions(root: Path) -> set[str]:
    galaxy = yaml.safe_load((root / "galaxy.yml").read_text()) or {}
    changelog_file = root / "changelogs" / "changelog.yaml"
    changelog = (yaml.safe_load(changelog_file.read_text()) if changelog_file.is_file() else None) or {}
    return {str(galaxy.get("version"))} | {str(v) for v in (changelog.get("releases") or {})}


def _documentation(path: Path) -> str:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if "DOCUMENTATION" in targets and isinstance(node.value, ast.Constant):
            return str(node.value.value)
    return ""


def _walk(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        if "version_added" in value:
            yield where, str(value["version_added"])
        for key, item in value.items():
            yield from _walk(item, f"{where}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item, where)


def versions_added(root: Path) -> Iterator[tuple[str, str]]:
    """(where, version) for every version_added of the plugins' and roles' documentation."""
    for path in sorted((root / "plugins").rglob("*.py")):
        text = _documentation(path)
        if text:
            yield from _walk(yaml.safe_load(text), str(path.relative_to(root)))
    for path in sorted((root / "plugins").rglob("*.yml")):
        yield from _walk(yaml.safe_load(path.read_text()), str(path.relative_to(root)))
    for path in sorted((root / "roles").glob("*/meta/argument_specs.yml")):
        yield from _walk(yaml.safe_load(path.read_text()), str(path.relative_to(root)))


def check(root: Path) -> list[str]:
    known = known_versions(root)
    return [
        f"{where}: version_added {version} is not a version of this collection ({', '.join(sorted(known))}: "
        "galaxy.yml's and the released ones in changelogs/changelog.yaml)"
        for where, version in versions_added(root)
        if version not in known
    ]

"""Build the list of kubespray's and DeepOps' inventory variables, the fixture our names are checked against.

A kubespray or DeepOps inventory is the one a GPU cluster's operators already have; site.yml runs against it. Where
one of its variables has the name of one of ours, our preflight reads their value (kubespray's kubelet_feature_gates
is a list of "Name=true" strings, ours was a dict), or our role acts on a value set for theirs. This reads, from a git
checkout of each project at one commit, the variables their roles define (roles/**/defaults/**/*.yml) and their
inventory samples set or show commented out (kubespray's inventory/sample/group_vars, DeepOps' config.example),
with the type of each value, and writes them with the commits and paths as JSON.

Usage: python tools/foreign_variables.py OUT.json kubespray=/path/to/kubespray.git deepops=/path/to/deepops.git
(a bare mirror or a checkout; HEAD is read). tests/unit/tools/fixtures/foreign_variables.json is its output.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

PROJECTS: dict[str, dict[str, Any]] = {
    "kubespray": {
        "repository": "https://github.com/kubernetes-sigs/kubespray",
        "defaults": ["roles/*/defaults/*.yml", "roles/**/defaults/**/*.yml"],
        "inventory": ["inventory/sample/group_vars/**/*.yml", "inventory/sample/group_vars/*.yml"],
    },
    "deepops": {
        "repository": "https://github.com/NVIDIA/deepops",
        "defaults": ["roles/*/defaults/*.yml", "roles/**/defaults/**/*.yml"],
        "inventory": ["config.example/group_vars/*.yml", "config.example/host_vars/*"],
    },
}
_COMMENTED = re.compile(r"^#\s?([a-z_][a-z0-9_]*):(?:\s(.*))?$")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return "none" if value is None else "unknown"


def variables_of(text: str, commented: bool) -> dict[str, dict[str, Any]]:
    """Top-level variables of a YAML file; with commented, also `# name: value` lines (a sample's options)."""
    found: dict[str, dict[str, Any]] = {}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict):
        for name, value in data.items():
            if isinstance(name, str):
                found[name] = {"type": _type(value), "commented": False}
    if commented:
        for line in text.splitlines():
            match = _COMMENTED.match(line)
            if not match or match[1] in found:
                continue
            try:
                value = yaml.safe_load(match[2] or "")
            except yaml.YAMLError:
                value = ...
            found[match[1]] = {"type": "unknown" if value is ... else _type(value), "commented": True}
    return found


def collect(project: str, repo: Path) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The project's variables, each with its places as PROJECT:PATH:TYPE[:commented]."""
    spec = PROJECTS[project]
    commit = _git(repo, "rev-parse", "HEAD").strip()
    date = _git(repo, "show", "-s", "--format=%cI", "HEAD").strip()
    files = _git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
    variables: dict[str, list[str]] = {}
    read: list[str] = []
    for kind in ("defaults", "inventory"):
        for path in sorted(f for f in files if any(fnmatch.fnmatch(f, p) for p in spec[kind])):
            read.append(path)
            text = _git(repo, "show", f"HEAD:{path}")
            for name, info in variables_of(text, commented=kind == "inventory").items():
                place = f"{project}:{path}:{info['type']}" + (":commented" if info["commented"] else "")
                variables.setdefault(name, []).append(place)
    source = {
        "project": project,
        "repository": spec["repository"],
        "commit": commit,
        "date": date,
        "patterns": spec["defaults"] + spec["inventory"],
        "files": len(read),
    }
    return source, variables


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    sources: list[dict[str, Any]] = []
    variables: dict[str, list[str]] = {}
    for item in argv[2:]:
        project, path = item.split("=", 1)
        source, found = collect(project, Path(path))
        sources.append(source)
        for name, places in found.items():
            variables.setdefault(name, []).extend(places)
    document = {
        "about": "Variables of kubespray's and DeepOps' roles and inventory samples (tools/foreign_variables.py).",
        "sources": sources,
        "variables": dict(sorted(variables.items())),
    }
    # One line per variable: reviewable in a diff when the fixture is built again from newer commits.
    lines = [f"  {json.dumps(name)}: {json.dumps(places, separators=(',', ':'))}" for name, places in variables.items()]
    head = json.dumps({k: v for k, v in document.items() if k != "variables"}, indent=1)[:-2]
    out.write_text(head + ',\n "variables": {\n' + ",\n".join(sorted(lines)) + "\n }\n}\n")
    print(f"{out}: {len(variables)} variables from {', '.join(s['project'] for s in sources)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

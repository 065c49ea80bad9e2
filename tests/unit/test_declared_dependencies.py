"""What the collection declares it needs (galaxy.yml, requirements.txt, meta/execution-environment.yml) against what
its content uses: a role or playbook that starts calling another collection, or a plugin that imports a new Python
package, fails here until the declaration says so (an execution environment built from the declarations would lack
it otherwise, and AWX would fail at run time)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]
OWN = {"ansible.builtin", "kubegpu.node", "ansible.legacy"}
# `ns.name.plugin:` as a task key, or a role/playbook/plugin named by FQCN in a string.
FQCN = re.compile(r"(?<![\w.])([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*(?![\w.])")
YAML_KEYS_WITH_FQCN = re.compile(r"^\s*-?\s*([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*:", re.MULTILINE)
ROLE_OR_PLAYBOOK_REF = re.compile(
    r"(?:role|name|import_playbook|include_role|import_role)\s*:\s*\"?([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*)\.[a-z0-9_]+\"?\s*$",
    re.MULTILINE,
)


def _galaxy() -> dict:
    return yaml.safe_load((REPO / "galaxy.yml").read_text())


def _collections_used() -> set[str]:
    used: set[str] = set()
    for path in [*REPO.glob("roles/**/*.yml"), *REPO.glob("playbooks/**/*.yml")]:
        text = path.read_text()
        used.update(YAML_KEYS_WITH_FQCN.findall(text))
        used.update(ROLE_OR_PLAYBOOK_REF.findall(text))
    for path in REPO.glob("plugins/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ansible_collections."):
                used.add(".".join(node.module.split(".")[1:3]))
    return used - OWN


def _python_imports() -> set[str]:
    """Top-level packages the plugins import that are neither the standard library nor Ansible."""
    found: set[str] = set()
    for path in REPO.glob("plugins/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names} - {"ansible", "ansible_collections"}


def _requirements() -> dict[str, Requirement]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    reqs = [Requirement(line.split("#")[0]) for line in lines if line.split("#")[0].strip()]
    return {r.name.lower(): r for r in reqs}


def test_every_collection_the_content_uses_is_a_bounded_dependency():
    declared = _galaxy().get("dependencies") or {}
    missing = _collections_used() - set(declared)
    assert not missing, f"used but not in galaxy.yml dependencies: {sorted(missing)}"
    for name, bound in declared.items():
        spec = SpecifierSet(str(bound).replace(" ", ""))
        assert any(s.operator in (">=", ">") for s in spec) and any(s.operator in ("<", "<=") for s in spec), (
            f"{name}: {bound!r} needs a floor and a ceiling (a major release may break the collection)"
        )


def test_the_scan_sees_a_collection_a_role_would_use(tmp_path, monkeypatch):
    role = tmp_path / "roles" / "drain" / "tasks"
    role.mkdir(parents=True)
    (role / "main.yml").write_text("- name: Drain\n  kubernetes.core.k8s_drain:\n    name: x\n")
    (tmp_path / "plugins").mkdir()
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert _collections_used() == {"kubernetes.core"}


def test_every_python_package_the_plugins_import_is_in_requirements_txt():
    declared = _requirements()
    assert "kubernetes" in declared
    for name in _python_imports():
        assert name.lower() in declared or name == "yaml", (
            f"plugins import {name!r}, which requirements.txt does not list (an execution environment would lack it)"
        )
    for name, req in declared.items():
        ops = {s.operator for s in req.specifier}
        assert ops & {">=", ">"} and ops & {"<", "<="}, f"{name}: {req.specifier} needs a floor and a ceiling"


def test_the_execution_environment_metadata_points_at_the_requirements():
    meta = yaml.safe_load((REPO / "meta" / "execution-environment.yml").read_text())
    assert meta["dependencies"]["python"] == "requirements.txt"
    bindep = meta["dependencies"].get("system")
    assert bindep is None or (REPO / bindep).is_file()


def test_galaxy_yml_links_and_build_ignores():
    galaxy = _galaxy()
    for key in ("repository", "documentation", "issues"):
        assert str(galaxy.get(key, "")).startswith("https://"), f"galaxy.yml has no {key} link"
    # The link that lets a plain clone find the collection must not be packed: it points at the tarball's own root.
    assert {"collections", "execution-environment", "examples", "ansible.cfg"} <= set(galaxy["build_ignore"])

"""docs/architecture.md names every role and every plugin file, so that it stays the map of the collection."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "architecture.md").read_text()


def _roles() -> list[str]:
    return sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())


def _plugin_files() -> list[str]:
    """Each plugin file by its path under plugins/ (a package of module_utils counts once, by its folder)."""
    found: set[str] = set()
    for path in (REPO / "plugins").rglob("*.py"):
        relative = path.relative_to(REPO / "plugins")
        if path.name == "__init__.py":
            continue
        if relative.parts[0] == "module_utils" and len(relative.parts) > 2:
            found.add(f"module_utils/{relative.parts[1]}/")
        else:
            found.add(str(relative))
    return sorted(found)


@pytest.mark.parametrize("role", _roles())
def test_every_role_is_in_the_architecture(role):
    assert f"roles/{role}/" in DOC, f"docs/architecture.md does not name roles/{role}/"


@pytest.mark.parametrize("plugin", _plugin_files())
def test_every_plugin_file_is_in_the_architecture(plugin):
    assert plugin in DOC, f"docs/architecture.md does not name plugins/{plugin}"


def test_the_public_and_private_rule_is_written_down():
    assert "## Public and private" in DOC
    assert "a plugin is public when a user would call it on its own" in DOC


def _filters_in_the_table() -> dict[str, bool]:
    """Each filter of the "Public and private" table, by its fully qualified name, and whether it is public."""
    table = DOC.split("## Public and private", 1)[1].split("\n## ", 1)[0]
    found: dict[str, bool] = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or "(filter" not in cells[0]:
            continue
        for name in re.findall(r"`(kubegpu\.node\.[A-Za-z0-9_]+)`", cells[0]):
            found[name] = cells[1] == "yes"
    return found


def _ansible_doc(*args: str, tmp_path: Path) -> str:
    """ansible-doc of this venv against this checkout alone (a collections path holding only a link to it)."""
    link = tmp_path / "ansible_collections" / "kubegpu" / "node"
    link.parent.mkdir(parents=True)
    link.symlink_to(REPO)
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(tmp_path),
        ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
        ANSIBLE_HOME=str(tmp_path / "home"),
    )
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "ansible.cli.doc", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    return done.stdout


def test_ansible_doc_lists_exactly_the_public_filters(tmp_path):
    table = _filters_in_the_table()
    public = sorted(name for name, is_public in table.items() if is_public)
    assert "kubegpu.node.gpu_labels" in public and "kubegpu.node._restart_safety" in table
    listed = sorted(json.loads(_ansible_doc("-t", "filter", "-l", "--json", "kubegpu.node", tmp_path=tmp_path)))
    assert listed == public, (
        "ansible-doc lists the filters docs/architecture.md's 'Public and private' table calls public, and no other: "
        "make a role's or site.yml's filter private (plugins/filter/__internal.py) or mark it public in the table"
    )


def test_every_filter_a_playbook_calls_is_in_the_table():
    table = _filters_in_the_table()
    called: set[str] = set()
    for path in [*REPO.glob("playbooks/**/*.yml"), *REPO.glob("roles/**/*.yml"), *REPO.glob("roles/**/*.j2")]:
        called.update(re.findall(r"\|\s*(kubegpu\.node\.[A-Za-z0-9_]+)", path.read_text()))
    assert called, "no call of a kubegpu.node filter found: the pattern is wrong"
    assert sorted(called - set(table)) == []
    private = {name for name, is_public in table.items() if not is_public}
    assert all(name.split(".")[-1].startswith("_") for name in private), "a private filter's name starts with _"

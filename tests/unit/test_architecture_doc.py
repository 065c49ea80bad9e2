"""docs/architecture.md names every role and every plugin file, so that it stays the map of the collection."""

from __future__ import annotations

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

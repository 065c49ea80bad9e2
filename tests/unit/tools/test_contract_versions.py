"""tools/contract/versions.py: every version_added is a version this collection has."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))

from contract import versions


def _root(tmp_path: Path, releases: str = "{}") -> Path:
    (tmp_path / "galaxy.yml").write_text("namespace: kubegpu\nname: node\nversion: 0.2.0\n")
    (tmp_path / "changelogs").mkdir()
    (tmp_path / "changelogs" / "changelog.yaml").write_text(f"ancestor: null\nreleases: {releases}\n")
    (tmp_path / "plugins" / "modules").mkdir(parents=True)
    (tmp_path / "plugins" / "filter").mkdir(parents=True)
    (tmp_path / "roles").mkdir()
    return tmp_path


def test_galaxys_version_and_released_ones_pass_a_later_one_is_refused(tmp_path):
    root = _root(tmp_path, "{0.1.0: {}}")
    (root / "plugins" / "modules" / "a.py").write_text(
        'DOCUMENTATION = r"""\nmodule: a\nversion_added: 0.1.0\noptions:\n  x:\n    version_added: 0.3.0\n"""\n'
    )
    (root / "plugins" / "filter" / "b.yml").write_text("DOCUMENTATION:\n  name: b\n  version_added: 0.2.0\n")
    assert versions.check(root) == [
        "plugins/modules/a.py.options.x: version_added 0.3.0 is not a version of this collection (0.1.0, 0.2.0: "
        "galaxy.yml's and the released ones in changelogs/changelog.yaml)"
    ]


def test_the_collection_documents_only_its_own_versions():
    assert versions.check(REPO) == []

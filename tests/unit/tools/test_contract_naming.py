"""tools/contract/naming.py and tools/foreign_variables.py: the naming table of docs/naming.md, enforced."""

from __future__ import annotations

import datetime
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))

from contract import naming

_spec = importlib.util.spec_from_file_location("foreign_variables", REPO / "tools" / "foreign_variables.py")
foreign_variables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(foreign_variables)

PAGE = """
## Concepts every role names the same way

| concept | name | type | values |
|---|---|---|---|
| state | `<role>_state` | str | `present`, `absent` |
| repository key fingerprints | `<role>_repository_key_fingerprints` | list of str | |
| CDI switch | `<role>_cdi` | bool | |
| restart knob | `<role>_restart` | str | `when_safe`, `always`, `never` |

## `state: absent`

| role | absent | why not |
|---|---|---|
| `demo` | yes | |
| `other` | no | it adds nothing of its own |

### Shared on purpose

| variable | theirs | why it may be shared |
|---|---|---|
| `demo_branch` | x | same meaning |

### Renamed (the old name is still read, with a deprecation warning)

| old name | new name | since | removed in |
|---|---|---|---|

### Names still to rename

| variable | rule | new name | listed | until |
|---|---|---|---|---|
{pending}
"""

GOOD = {
    "demo_state": {"type": "str", "choices": ["present", "absent"]},
    "demo_cdi": {"type": "bool"},
    "demo_restart": {"type": "str", "choices": ["when_safe", "always", "never"]},
    "demo_repository_key_fingerprints": {"type": "list", "elements": "str"},
    "demo_branch": {"type": "str"},
}
FOREIGN = {
    "variables": {
        "demo_feature_gates": ["kubespray:roles/kubespray_defaults/defaults/main/main.yml:list"],
        "demo_branch": ["deepops:config.example/group_vars/all.yml:str"],
    }
}


def _root(tmp_path: Path, pending: str = "") -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "naming.md").write_text(PAGE.replace("{pending}", pending))
    fixture = tmp_path / naming.FOREIGN
    fixture.parent.mkdir(parents=True)
    fixture.write_text(json.dumps(FOREIGN))
    return tmp_path


def test_a_role_that_follows_the_table_passes(tmp_path):
    assert naming.check(_root(tmp_path), {"demo": GOOD, "other": {"other_x": {"type": "str"}}}, {}) == []


@pytest.mark.parametrize(
    ("name", "spec", "expected"),
    [
        ("demo_cdi_enabled", {"type": "bool"}, "is a CDI switch: name it demo_cdi"),
        ("demo_restart", {"type": "bool"}, "is a restart knob: type str, not bool"),
        ("demo_repo_key_fingerprint", {"type": "str"}, "name it demo_repository_key_fingerprints"),
        ("demo_feature_gates", {"type": "dict"}, "is also kubespray's or DeepOps' variable (kubespray:roles/kubespray"),
    ],
)
def test_a_name_against_the_table_is_refused(tmp_path, name, spec, expected):
    problems = naming.check(_root(tmp_path), {"demo": {**GOOD, name: spec}, "other": {}}, {})
    assert any(p.startswith(f"{name}: ") and expected in p for p in problems), problems


def test_a_name_shared_on_purpose_must_have_their_type(tmp_path):
    problems = naming.check(_root(tmp_path), {"demo": {**GOOD, "demo_branch": {"type": "list"}}, "other": {}}, {})
    assert problems == [
        "demo_branch: is shared on purpose, but theirs is str and ours list "
        "(deepops:config.example/group_vars/all.yml:str)"
    ]


def test_state_absent_or_the_reason_why_not(tmp_path):
    no_state = {k: v for k, v in GOOD.items() if k != "demo_state"}
    problems = naming.check(_root(tmp_path), {"demo": no_state, "other": {}, "third": {}}, {})
    assert any("the `state: absent` table says yes for demo" in p for p in problems), problems
    assert any("role third is not in the `state: absent` table" in p for p in problems), problems


def test_the_list_still_to_rename_allows_a_name_until_its_date(tmp_path):
    roles = {"demo": {**GOOD, "demo_cdi_enabled": {"type": "bool"}}, "other": {}}
    today = datetime.date.today()
    later = (today + datetime.timedelta(days=30)).isoformat()
    row = f"| `demo_cdi_enabled` | CDI switch | `demo_cdi` | {today.isoformat()} | {later} |"
    assert naming.check(_root(tmp_path, row), roles, {}) == []
    expired = row.replace(later, (today - datetime.timedelta(days=1)).isoformat())
    (tmp_path / "expired").mkdir()
    problems = naming.check(_root(tmp_path / "expired", expired), roles, {})
    assert len(problems) == 1 and "its rename was due" in problems[0], problems


def test_a_name_listed_to_rename_that_breaks_nothing_must_leave_the_list(tmp_path):
    row = "| `demo_cdi` | x | y | 2026-11-25 | 2999-01-01 |"
    problems = naming.check(_root(tmp_path, row), {"demo": GOOD, "other": {}}, {})
    assert problems == [
        f"{naming.DOC}: demo_cdi is listed as still to rename, but breaks no rule now; take it off the list"
    ]


def test_the_collections_names_follow_the_table():
    page = naming.tables((REPO / naming.DOC).read_text())
    assert {"Concepts every role names the same way", "`state: absent`", "Names still to rename"} <= set(page)
    # Every listed rename is dated, and none for longer than a few months from when it was listed.
    for row in page["Names still to rename"]:
        listed = datetime.date.fromisoformat(row["listed"])
        until = datetime.date.fromisoformat(row["until"])
        assert listed <= until <= listed + datetime.timedelta(days=120), row


def test_the_fixture_names_its_sources_and_has_kubesprays_feature_gates_list():
    document = json.loads((REPO / naming.FOREIGN).read_text())
    projects = {source["project"]: source for source in document["sources"]}
    assert set(projects) == {"kubespray", "deepops"}
    assert all(len(source["commit"]) == 40 for source in projects.values())
    assert document["variables"]["kubelet_feature_gates"] == [
        "kubespray:roles/kubespray_defaults/defaults/main/main.yml:list"
    ]


def test_foreign_variables_reads_set_and_commented_out_variables():
    text = textwrap.dedent(
        """\
        ---
        kubelet_feature_gates: []
        ## the sample's options, commented out
        # nvidia_driver_version: "384.111"
        # kube_network_plugin: calico
        #   nested: not a variable
        """
    )
    found = foreign_variables.variables_of(text, commented=True)
    assert found == {
        "kubelet_feature_gates": {"type": "list", "commented": False},
        "nvidia_driver_version": {"type": "str", "commented": True},
        "kube_network_plugin": {"type": "str", "commented": True},
    }
    assert foreign_variables.variables_of(text, commented=False) == {
        "kubelet_feature_gates": {"type": "list", "commented": False}
    }

"""tools/contract/site.py: every site.yml variable the playbooks read is specified and documented."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))

from contract import site

SPECS = """
    argument_specs:
      site:
        options:
          kubegpu_drain: {type: bool, default: true}
          kubegpu_device_plugin_version: {type: str}
          kubegpu_device_plugin_image: {type: str}
    """


def _root(tmp_path: Path, tasks: str, readme: str) -> Path:
    (tmp_path / "playbooks" / "vars").mkdir(parents=True)
    (tmp_path / "playbooks" / "vars" / "site_argument_specs.yml").write_text(textwrap.dedent(SPECS))
    (tmp_path / "playbooks" / "tasks.yml").write_text(textwrap.dedent(tasks))
    (tmp_path / "roles").mkdir()
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


README = "| `kubegpu_drain` | x |\n| `kubegpu_device_plugin_version`, `_image` | passed on |\n"


def test_specified_read_and_documented_variables_pass(tmp_path):
    tasks = """
        - name: Drain
          ansible.builtin.debug:
            msg: "{{ kubegpu_drain | bool }} {{ kubegpu_device_plugin_image | default(omit) }}"
        - name: An output of the playbook, not an input
          ansible.builtin.set_fact:
            kubegpu_target_nodes: []
        - name: Read the output
          ansible.builtin.debug:
            msg: "{{ kubegpu_target_nodes }}"
    """
    assert site.check(_root(tmp_path, tasks, README)) == []


def test_a_variable_read_but_not_specified_is_refused(tmp_path):
    tasks = """
        - name: Read a new variable
          ansible.builtin.debug:
            msg: "{{ kubegpu_new_knob | default(1) }}"
    """
    problems = site.check(_root(tmp_path, tasks, README))
    assert problems == [
        "playbooks/tasks.yml: Read a new variable: kubegpu_new_knob is read by the playbook but is not in "
        "playbooks/vars/site_argument_specs.yml (add it there, and to README.md's site.yml variables)"
    ]


def test_a_variable_missing_from_the_readme_is_refused(tmp_path):
    problems = site.check(_root(tmp_path, "[]\n", "| `kubegpu_drain` | x |\n"))
    assert [p.split(": ")[1] for p in problems] == [
        "kubegpu_device_plugin_image is not documented in README.md (site.yml variables)",
        "kubegpu_device_plugin_version is not documented in README.md (site.yml variables)",
    ]


def test_the_collections_site_variables_are_specified_and_documented():
    assert site.check(REPO) == []

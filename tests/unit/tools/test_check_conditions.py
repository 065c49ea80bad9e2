"""The gate that finds a condition evaluated again after the tasks it guards changed what it reads."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _load_checker():
    spec = importlib.util.spec_from_file_location("check_conditions", REPO / "tools" / "check_conditions.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


def _write(root: Path, path: str, text: str) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(textwrap.dedent(text))


ROLE = """
    - name: Start the list
      ansible.builtin.set_fact:
        demo_pending: []
    - name: Restart
      ansible.builtin.command: "true"
      register: demo_restarted
"""


def test_the_held_back_shape_is_found(tmp_path):
    """The shape of the bug in site.yml's drain window: a block's condition reads what the role in it resets."""
    _write(tmp_path, "roles/demo/tasks/main.yml", ROLE)
    _write(
        tmp_path,
        "playbooks/tasks/window.yml",
        """
        - name: Restart what was held back
          when: demo_pending | default([]) | length > 0
          block:
            - name: Run the role
              ansible.builtin.include_role:
                name: kubegpu.node.demo
        """,
    )
    findings = checker.check(tmp_path)
    assert len(findings) == 1
    text = str(findings[0])
    assert text.startswith("playbooks/tasks/window.yml: Restart what was held back:")
    assert "reads demo_pending" in text
    assert "roles/demo/tasks/main.yml: Start the list" in text


def test_a_condition_read_into_a_fact_first_passes(tmp_path):
    _write(tmp_path, "roles/demo/tasks/main.yml", ROLE)
    _write(
        tmp_path,
        "playbooks/tasks/window.yml",
        """
        - name: Note what was held back
          ansible.builtin.set_fact:
            held: "{{ demo_pending | default([]) }}"
        - name: Restart what was held back
          when: held | length > 0
          block:
            - name: Run the role
              ansible.builtin.include_role:
                name: kubegpu.node.demo
        """,
    )
    assert checker.check(tmp_path) == []


def test_a_dynamic_include_evaluates_its_condition_once(tmp_path):
    """include_role / include_tasks without a loop: the condition is the include's alone (not inherited)."""
    _write(tmp_path, "roles/demo/tasks/main.yml", ROLE)
    _write(
        tmp_path,
        "playbooks/play.yml",
        """
        - name: Play
          hosts: all
          tasks:
            - name: Run the role
              ansible.builtin.include_role:
                name: demo
              when: demo_pending | default([]) | length > 0
        """,
    )
    assert checker.check(tmp_path) == []


def test_imports_loops_and_registers_are_followed(tmp_path):
    _write(tmp_path, "roles/demo/tasks/main.yml", ROLE)
    _write(tmp_path, "roles/demo/tasks/other.yml", "- name: Nothing\n  ansible.builtin.debug:\n    msg: hi\n")
    _write(
        tmp_path,
        "roles/demo/tasks/entry.yml",
        """
        - name: Imported, with a condition on what it registers
          ansible.builtin.import_tasks: main.yml
          when: demo_restarted is not defined
        - name: Each file in turn, while nothing was restarted
          ansible.builtin.include_role:
            name: kubegpu.node.demo
            tasks_from: "{{ step }}"
          loop: [other.yml, main.yml]
          loop_control:
            loop_var: step
          when: demo_restarted is not defined
        """,
    )
    findings = checker.check(tmp_path)
    assert [f.where for f in findings] == [
        "roles/demo/tasks/entry.yml: Imported, with a condition on what it registers",
        "roles/demo/tasks/entry.yml: Each file in turn, while nothing was restarted",
    ]
    assert all(f.shared == ["demo_restarted"] for f in findings)


def test_the_collection_passes():
    findings = checker.check(REPO)
    assert findings == [], "\n".join(map(str, findings))

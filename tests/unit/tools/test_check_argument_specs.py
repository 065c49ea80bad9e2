"""The gate that keeps each role's defaults/main.yml and meta/argument_specs.yml in agreement."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _load_checker():
    spec = importlib.util.spec_from_file_location("check_argument_specs", REPO / "tools" / "check_argument_specs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


def _role(tmp_path: Path, defaults: str, specs: str) -> Path:
    role = tmp_path / "roles" / "demo"
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text(textwrap.dedent(defaults))
    (role / "meta" / "argument_specs.yml").write_text(textwrap.dedent(specs))
    (role / "tasks").mkdir()
    (role / "tasks" / "main.yml").write_text("---\n[]\n")
    return role


SPECS = """
    argument_specs:
      main:
        options:
          demo_port:
            type: int
            default: 80
          demo_names:
            type: list
            elements: str
            default: []
    """


def test_agreeing_role_passes(tmp_path):
    role = _role(tmp_path, "demo_port: 80\ndemo_names: []\n", SPECS)
    assert checker.check_role(role) == []


@pytest.mark.parametrize(
    ("defaults", "specs", "expected"),
    [
        ("demo_port: 8080\ndemo_names: []\n", SPECS, "demo_port defaults to 8080 in defaults/main.yml but to 80"),
        ("demo_port: 80\ndemo_names: []\ndemo_extra: 1\n", SPECS, "demo_extra is in defaults/main.yml but not"),
        ("demo_port: 80\n", SPECS, "demo_names has a default in the specs but is not in defaults/main.yml"),
        (
            "demo_port: 80\n",
            "argument_specs:\n  main:\n    options:\n      demo_port: {type: int, default: 80}\n"
            "      demo_list: {type: list}\n",
            "list option demo_list has no 'elements'",
        ),
        (
            "",
            "argument_specs:\n  main:\n    options:\n      port: {type: int}\n",
            "option port does not start with 'demo_'",
        ),
    ],
)
def test_disagreement_is_reported(tmp_path, defaults, specs, expected):
    role = _role(tmp_path, defaults, specs)
    problems = checker.check_role(role)
    assert any(expected in p for p in problems), problems


def test_collection_roles_agree():
    assert checker.main(["check", str(REPO)]) == 0


# ----- entry points ----------------------------------------------------------------------------------------------

ENTRY_POINTS = """
    argument_specs:
      main:
        options: &demo_options
          demo_port: {type: int, default: 80}
      preflight:
        options: *demo_options
    """


def _tasks(role: Path, *names: str) -> None:
    (role / "tasks").mkdir(exist_ok=True)
    for name in names:
        (role / "tasks" / f"{name}.yml").write_text("---\n[]\n")


def test_an_entry_point_sharing_mains_options_passes(tmp_path):
    role = _role(tmp_path, "demo_port: 80\n", ENTRY_POINTS)
    _tasks(role, "main", "preflight")
    assert checker.check_role(role) == []


def test_an_entry_point_with_a_copy_of_the_options_is_refused(tmp_path):
    copied = ENTRY_POINTS.replace("options: *demo_options", "options:\n          demo_port: {type: int, default: 80}")
    role = _role(tmp_path, "demo_port: 80\n", copied)
    _tasks(role, "main", "preflight")
    assert any("entry point preflight defines its options again" in p for p in checker.check_role(role))


def test_an_entry_point_is_checked_like_main(tmp_path):
    # A copy that drifted: its default no longer agrees with defaults/main.yml.
    drifted = ENTRY_POINTS.replace("options: *demo_options", "options:\n          demo_port: {type: int, default: 8}")
    role = _role(tmp_path, "demo_port: 80\n", drifted)
    _tasks(role, "main", "preflight")
    assert any("demo (preflight): demo_port defaults to 80" in p for p in checker.check_role(role))


def test_an_entry_point_without_its_task_file_is_refused(tmp_path):
    role = _role(tmp_path, "demo_port: 80\n", ENTRY_POINTS)
    _tasks(role, "main")
    assert checker.check_role(role) == ["demo: entry point preflight has no tasks/preflight.yml"]


def _playbook(tmp_path: Path, text: str) -> None:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "site.yml").write_text(textwrap.dedent(text))


@pytest.mark.parametrize(
    ("tasks_from", "loop", "expected"),
    [
        ("preflight", None, []),
        ("preflight.yml", None, ["'preflight.yml' of demo is not an entry point", "(write tasks_from: preflight)"]),
        ("apply", None, ["'apply' of demo is not an entry point"]),
        ("'{{ step }}'", "[main, preflight]", []),
        ("'{{ step }}'", "[main, apply]", ["'apply' of demo is not an entry point"]),
        ("'{{ step }}'", "'{{ steps }}'", ["cannot be checked"]),
    ],
)
def test_every_tasks_from_names_an_entry_point(tmp_path, tasks_from, loop, expected):
    role = _role(tmp_path, "demo_port: 80\n", ENTRY_POINTS)
    _tasks(role, "main", "preflight", "apply")
    loop_lines = f"\n          loop: {loop}\n          loop_control: {{loop_var: step}}" if loop else ""
    _playbook(
        tmp_path,
        f"""
        - hosts: all
          tasks:
            - name: Call the role
              block:
                - name: Include it
                  ansible.builtin.include_role:
                    name: kubegpu.node.demo
                    tasks_from: {tasks_from}{loop_lines.replace(chr(10), chr(10) + "        ")}
        """,
    )
    problems = checker.check_calls(tmp_path)
    assert len(problems) == (1 if expected else 0), problems
    for text in expected:
        assert text in problems[0], problems

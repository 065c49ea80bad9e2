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

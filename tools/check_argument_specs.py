"""Fail when a role's meta/argument_specs.yml and defaults/main.yml disagree.

Checks, for every role and its `main` entry point:
- every variable in defaults/main.yml is an option in the argument specs, and every option with a default is in
  defaults/main.yml;
- the default in the specs equals the value in defaults/main.yml;
- every list option says what its elements are;
- every public variable starts with the role's name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml


def check_role(role: Path) -> list[str]:
    problems: list[str] = []
    specs_file = role / "meta" / "argument_specs.yml"
    defaults_file = role / "defaults" / "main.yml"
    if not specs_file.is_file():
        return [f"{role.name}: meta/argument_specs.yml is missing"]
    specs = yaml.safe_load(specs_file.read_text()) or {}
    options = (specs.get("argument_specs", {}).get("main", {}) or {}).get("options", {}) or {}
    defaults = yaml.safe_load(defaults_file.read_text()) if defaults_file.is_file() else {}
    defaults = defaults or {}

    for name in sorted(defaults):
        if name not in options:
            problems.append(f"{role.name}: {name} is in defaults/main.yml but not in meta/argument_specs.yml")
    for name, spec in sorted(options.items()):
        spec = spec or {}
        if not name.startswith(f"{role.name}_"):
            problems.append(f"{role.name}: option {name} does not start with '{role.name}_'")
        if spec.get("type") == "list" and "elements" not in spec:
            problems.append(f"{role.name}: list option {name} has no 'elements'")
        if "default" in spec:
            if name not in defaults:
                problems.append(f"{role.name}: {name} has a default in the specs but is not in defaults/main.yml")
            elif defaults[name] != spec["default"]:
                problems.append(
                    f"{role.name}: {name} defaults to {defaults[name]!r} in defaults/main.yml "
                    f"but to {spec['default']!r} in meta/argument_specs.yml"
                )
        elif name in defaults and not spec.get("required"):
            problems.append(f"{role.name}: {name} is in defaults/main.yml but has no default in the specs")
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    roles = sorted(p for p in (root / "roles").iterdir() if p.is_dir())
    problems = [problem for role in roles for problem in check_role(role)]
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"argument specs: {len(roles)} roles checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

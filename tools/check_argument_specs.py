"""The variable contract of the collection's roles, checked in `make lint`.

For every role and every entry point of its meta/argument_specs.yml (internal roles, whose name starts with `_`, take
no public variables and have neither):
- every variable in defaults/main.yml is an option, and every option with a default is in defaults/main.yml, with the
  same value;
- every list option says what its elements are; every public variable starts with the role's name;
- every entry point validates the role's options from one definition: its `options` is a YAML alias of main's
  (`options: *<role>_options`), or each of its options an alias of main's option of that name, never a copy;
- every entry point is a task file (`tasks/<name>.yml`);
and every `tasks_from:` in the collection's playbooks and roles names an entry point of that role's specs, written
without `.yml` (Ansible looks the spec up by the exact `tasks_from` value: `tasks_from: preflight.yml` validates
nothing).

Then site.yml's own variables (tools/contract/site.py: each kubegpu_* variable the playbooks read is in
playbooks/vars/site_argument_specs.yml and README.md), and every boolean of the roles and of site.yml read as a
boolean wherever it is used (tools/contract/booleans.py); and the naming table of docs/naming.md, with the names of
kubespray's and DeepOps' variables (tools/contract/naming.py); and every version_added against galaxy.yml's version
and the released ones (tools/contract/versions.py).

Usage: python tools/check_argument_specs.py [ROOT]
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from contract import booleans, naming, site, versions

COLLECTION_PREFIX = "kubegpu.node."
ROLE_INCLUDES = {"include_role", "ansible.builtin.include_role", "import_role", "ansible.builtin.import_role"}
TASK_LISTS = ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always")
_SINGLE_VARIABLE = re.compile(r"^\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}$")


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def entry_points(role: Path) -> dict[str, dict[str, Any]]:
    """The entry points of a role's argument specs ({} when it has none)."""
    specs = _load(role / "meta" / "argument_specs.yml") or {}
    return {name: (spec or {}) for name, spec in (specs.get("argument_specs") or {}).items()}


def _options_nodes(specs_file: Path) -> dict[str, yaml.Node | None]:
    """Each entry point's `options` node, as composed (an alias is the very node it refers to)."""
    root = yaml.compose(specs_file.read_text())
    found: dict[str, yaml.Node | None] = {}

    def value(mapping: yaml.Node | None, key: str) -> yaml.Node | None:
        if not isinstance(mapping, yaml.MappingNode):
            return None
        return next((v for k, v in mapping.value if k.value == key), None)

    entries = value(root, "argument_specs")
    if isinstance(entries, yaml.MappingNode):
        for key, entry in entries.value:
            found[key.value] = value(entry, "options")
    return found


def _shares_main(options: yaml.Node | None, main: yaml.Node | None) -> bool:
    if options is None or options is main:
        return True
    if not isinstance(options, yaml.MappingNode) or not isinstance(main, yaml.MappingNode):
        return False
    main_options = {k.value: v for k, v in main.value}
    return all(main_options.get(k.value) is v for k, v in options.value)


def check_options(role: Path, entry: str, options: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    where = role.name if entry == "main" else f"{role.name} ({entry})"
    if entry == "main":
        for name in sorted(defaults):
            if name not in options:
                problems.append(f"{where}: {name} is in defaults/main.yml but not in meta/argument_specs.yml")
    for name, spec in sorted(options.items()):
        spec = spec or {}
        if not name.startswith(f"{role.name}_"):
            problems.append(f"{where}: option {name} does not start with '{role.name}_'")
        if spec.get("type") == "list" and "elements" not in spec:
            problems.append(f"{where}: list option {name} has no 'elements'")
        if "default" in spec:
            if name not in defaults:
                problems.append(f"{where}: {name} has a default in the specs but is not in defaults/main.yml")
            elif defaults[name] != spec["default"]:
                problems.append(
                    f"{where}: {name} defaults to {defaults[name]!r} in defaults/main.yml "
                    f"but to {spec['default']!r} in meta/argument_specs.yml"
                )
        elif name in defaults and not spec.get("required"):
            problems.append(f"{where}: {name} is in defaults/main.yml but has no default in the specs")
    return problems


def check_role(role: Path) -> list[str]:
    specs_file = role / "meta" / "argument_specs.yml"
    if role.name.startswith("_"):
        # An internal role (roles/_common) takes no public variables: nothing for a user to set, nothing to validate.
        if specs_file.is_file() or (role / "defaults").exists():
            return [f"{role.name}: an internal role has no public variables (no defaults/, no meta/argument_specs.yml)"]
        return []
    if not specs_file.is_file():
        return [f"{role.name}: meta/argument_specs.yml is missing"]
    entries = entry_points(role)
    if "main" not in entries and (role / "tasks" / "main.yml").is_file():
        return [f"{role.name}: meta/argument_specs.yml has no entry point main"]
    defaults = _load(role / "defaults" / "main.yml") or {}
    nodes = _options_nodes(specs_file)
    problems: list[str] = []
    for entry, spec in entries.items():
        problems += check_options(role, entry, spec.get("options") or {}, defaults)
        if not (role / "tasks" / f"{entry}.yml").is_file():
            problems.append(f"{role.name}: entry point {entry} has no tasks/{entry}.yml")
        if entry != "main" and not _shares_main(nodes.get(entry), nodes.get("main")):
            problems.append(
                f"{role.name}: entry point {entry} defines its options again; make them an alias of main's "
                f"(options: *{role.name}_options) so that each option is defined once"
            )
    return problems


# ----- every tasks_from names an entry point -------------------------------------------------------------------------


def _tasks(items: Any) -> Iterator[dict[str, Any]]:
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        yield item
        for key in TASK_LISTS:
            yield from _tasks(item.get(key))


def role_calls(path: Path) -> Iterator[tuple[str, str, list[str] | None, Any]]:
    """(role, tasks_from as written, its values when a loop gives them, rolespec_validate) for each role include with
    tasks_from."""
    data = _load(path)
    for task in _tasks(data):
        for key in ROLE_INCLUDES & set(task):
            args = task[key]
            if not isinstance(args, dict) or "tasks_from" not in args:
                continue
            written = str(args["tasks_from"])
            values: list[str] | None = [written]
            variable = _SINGLE_VARIABLE.match(written)
            if variable:
                loop_var = (task.get("loop_control") or {}).get("loop_var", "item")
                loop = task.get("loop")
                literal = isinstance(loop, list) and all(isinstance(v, str) for v in loop)
                values = list(loop) if variable[1] == loop_var and literal else None
            yield str(args.get("name", "")), written, values, args.get("rolespec_validate", True)


def check_calls(root: Path) -> list[str]:
    roles = {p.name for p in (root / "roles").iterdir() if p.is_dir()}
    files = sorted((root / "playbooks").rglob("*.yml")) + sorted((root / "roles").glob("*/tasks/**/*.yml"))
    problems: list[str] = []
    for path in files:
        where = path.relative_to(root)
        for name, written, values, validate in role_calls(path):
            role = name.removeprefix(COLLECTION_PREFIX)
            if role not in roles:
                continue
            if values is None:
                problems.append(f"{where}: tasks_from {written!r} of {role} cannot be checked; loop over literal names")
                continue
            entries = entry_points(root / "roles" / role)
            for value in values:
                if role.startswith("_"):
                    if not (root / "roles" / role / "tasks" / f"{value}.yml").is_file():
                        problems.append(f"{where}: tasks_from {value!r} of {role}: no tasks/{value}.yml")
                elif value not in entries and not (
                    validate is False and _imported_by_entry(root / "roles" / role, value)
                ):
                    hint = f" (write tasks_from: {value[:-4]})" if value.endswith(".yml") else ""
                    problems.append(
                        f"{where}: tasks_from {value!r} of {role} is not an entry point of its "
                        f"meta/argument_specs.yml, so its variables are not validated{hint}"
                    )
    return problems


def _imported_by_entry(role: Path, name: str) -> str | None:
    """The entry point whose tasks file imports tasks/<name>.yml (the entry point less its node layer, which
    kubegpu.node.site includes with rolespec_validate false after checking that entry point's options itself)."""
    for entry in entry_points(role):
        for task in _tasks(_load(role / "tasks" / f"{entry}.yml")):
            if str(task.get("ansible.builtin.import_tasks", task.get("import_tasks", ""))) == f"{name}.yml":
                return entry
    return None


def boolean_variables(root: Path) -> set[str]:
    """Every variable of type bool: the roles' options (any entry point) and site.yml's."""
    names = {
        name
        for role in sorted(p for p in (root / "roles").iterdir() if p.is_dir())
        for spec in entry_points(role).values()
        for name, option in (spec.get("options") or {}).items()
        if (option or {}).get("type") == "bool"
    }
    return names | {name for name, option in site.options(root).items() if (option or {}).get("type") == "bool"}


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    roles = sorted(p for p in (root / "roles").iterdir() if p.is_dir())
    problems = [problem for role in roles for problem in check_role(role)]
    problems += check_calls(root)
    problems += site.check(root)
    public = {
        role.name: {
            name: option for spec in entry_points(role).values() for name, option in (spec.get("options") or {}).items()
        }
        for role in roles
        if not role.name.startswith("_")
    }
    problems += naming.check(root, public, site.options(root))
    problems += versions.check(root)
    flags = boolean_variables(root)
    problems += booleans.check(root, flags, booleans.ModuleOptions(os.environ.get("ANSIBLE_COLLECTIONS_PATH"), root))
    for problem in problems:
        print(problem, file=sys.stderr)
    entries = sum(len(entry_points(role)) for role in roles)
    print(
        f"argument specs: {len(roles)} roles, {entries} entry points, site.yml's {len(site.options(root))} variables, "
        f"every use of {len(flags)} booleans checked, {len(problems)} problems"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

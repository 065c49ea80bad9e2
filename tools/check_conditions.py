"""Fail where a condition is evaluated again after the tasks it guards changed what it reads.

Ansible evaluates a `when:` on a block, on an `import_tasks` / `import_role`, or on a `roles:` entry again for every
task inside (it is inherited), and a `when:` on a looped `include_tasks` / `include_role` again for every item, after
the earlier items ran. When those tasks set a variable the condition reads (`set_fact`, `register`), the condition
changes halfway: a role that starts by resetting the list it reports (`container_runtime_pending_restarts: []`) skips
the rest of itself silently. This gate reads every task file of the collection, follows the imports and includes it can
resolve (role names, file names, literal loops over file names), and names each such condition with the variable it
shares with the tasks it guards. The fix is to read the value into a fact of its own before the block, and test that.

Usage: python tools/check_conditions.py [ROOT]
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, nodes
from jinja2.exceptions import TemplateSyntaxError

COLLECTION_PREFIX = "kubegpu.node."
INCLUDE_TASKS = {"include_tasks", "ansible.builtin.include_tasks"}
IMPORT_TASKS = {"import_tasks", "ansible.builtin.import_tasks"}
INCLUDE_ROLE = {"include_role", "ansible.builtin.include_role"}
IMPORT_ROLE = {"import_role", "ansible.builtin.import_role"}
SET_FACT = {"set_fact", "ansible.builtin.set_fact"}
SET_FACT_OPTIONS = {"cacheable"}
TEMPLATED = re.compile(r"{{|{%")

_JINJA = Environment()


@dataclass
class Finding:
    where: str
    condition: str
    shared: list[str]
    setters: list[str]

    def __str__(self) -> str:
        return (
            f"{self.where}: the condition `{self.condition}` reads {', '.join(self.shared)}, which the tasks it guards "
            f"set ({'; '.join(self.setters)}). Read it into a fact of its own before them and test that."
        )


@dataclass
class Context:
    root: Path
    findings: list[Finding] = field(default_factory=list)
    _assigned: dict[Path, dict[str, list[str]]] = field(default_factory=dict)


def condition_variables(when: Any) -> set[str]:
    """The variables a `when:` reads (its top-level names, as Jinja sees them)."""
    items = when if isinstance(when, list) else [when]
    names: set[str] = set()
    for item in items:
        if isinstance(item, bool) or item is None:
            continue
        text = str(item)
        expression = text if TEMPLATED.search(text) else "{{ " + text + " }}"
        try:
            tree = _JINJA.parse(expression)
        except TemplateSyntaxError:
            continue
        # Every name read; filters and tests are not names, so unknown (Ansible's) filters do not matter here.
        names |= {node.name for node in tree.find_all(nodes.Name) if node.ctx == "load"}
    return names


def _module(task: dict[str, Any]) -> tuple[str | None, Any]:
    for key, value in task.items():
        if key in INCLUDE_TASKS | IMPORT_TASKS | INCLUDE_ROLE | IMPORT_ROLE | SET_FACT:
            return key, value
    return None, None


def _role_tasks(root: Path, args: Any, tasks_from: str | None = None) -> Path | None:
    if not isinstance(args, dict):
        return None
    name = str(args.get("name", ""))
    if name.startswith(COLLECTION_PREFIX):
        name = name[len(COLLECTION_PREFIX) :]
    if not name or TEMPLATED.search(name):
        return None
    entry = tasks_from or str(args.get("tasks_from", "main"))
    if TEMPLATED.search(entry):
        return None
    if not entry.endswith((".yml", ".yaml")):
        entry += ".yml"
    path = root / "roles" / name / "tasks" / entry
    return path if path.is_file() else None


def _task_file(base: Path, args: Any, file_name: str | None = None) -> Path | None:
    target = file_name if file_name is not None else (args.get("file") if isinstance(args, dict) else args)
    if not isinstance(target, str) or TEMPLATED.search(target):
        return None
    path = (base / target).resolve()
    return path if path.is_file() else None


def _targets(ctx: Context, task: dict[str, Any], base: Path) -> list[Path]:
    """The task files an import or include leads to (a literal loop over file names gives each of them)."""
    key, args = _module(task)
    if key is None or key in SET_FACT:
        return []
    loop = task.get("loop") if isinstance(task.get("loop"), list) else None
    roles = key in INCLUDE_ROLE | IMPORT_ROLE
    if loop and all(isinstance(item, str) for item in loop):
        variable = (task.get("loop_control") or {}).get("loop_var", "item")
        spec = args.get("tasks_from") if roles and isinstance(args, dict) else args
        spec = spec.get("file") if isinstance(spec, dict) else spec
        if isinstance(spec, str) and re.fullmatch(r"{{\s*" + re.escape(variable) + r"\s*}}", spec.strip()):
            found = [_role_tasks(ctx.root, args, item) if roles else _task_file(base, args, item) for item in loop]
            return [path for path in found if path is not None]
    found_one = _role_tasks(ctx.root, args) if roles else _task_file(base, args)
    return [found_one] if found_one is not None else []


def _tasks_of(path: Path) -> list[dict[str, Any]]:
    data = yaml.safe_load(path.read_text()) or []
    return [task for task in data if isinstance(task, dict)] if isinstance(data, list) else []


def assigned(ctx: Context, path: Path, seen: frozenset[Path] = frozenset()) -> dict[str, list[str]]:
    """Every variable the tasks of `path` may set (set_fact keys, register), with where, following includes."""
    if path in ctx._assigned:
        return ctx._assigned[path]
    if path in seen:
        return {}
    result = _assigned_in(ctx, _tasks_of(path), path.parent, path, seen | {path})
    ctx._assigned[path] = result
    return result


def _note(result: dict[str, list[str]], name: str, where: str) -> None:
    result.setdefault(name, [])
    if where not in result[name]:
        result[name].append(where)


def _assigned_in(
    ctx: Context, tasks: list[dict[str, Any]], base: Path, path: Path, seen: frozenset[Path]
) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for task in tasks:
        where = f"{path.relative_to(ctx.root)}: {task.get('name', '(unnamed)')}"
        for section in ("block", "rescue", "always"):
            if isinstance(task.get(section), list):
                for name, places in _assigned_in(ctx, task[section], base, path, seen).items():
                    for place in places:
                        _note(result, name, place)
        if isinstance(task.get("register"), str):
            _note(result, task["register"], where)
        key, args = _module(task)
        if key in SET_FACT and isinstance(args, dict):
            for name in args:
                if name not in SET_FACT_OPTIONS:
                    _note(result, name, where)
        for target in _targets(ctx, task, base):
            for name, places in assigned(ctx, target, seen).items():
                for place in places:
                    _note(result, name, place)
    return result


def _inherits(task: dict[str, Any]) -> bool:
    """Whether this task's `when:` is evaluated again for the tasks it leads to."""
    key, _args = _module(task)
    if "block" in task:
        return True
    if key in IMPORT_TASKS | IMPORT_ROLE:
        return True
    return key in INCLUDE_TASKS | INCLUDE_ROLE and isinstance(task.get("loop"), list) and len(task["loop"]) > 1


def _guarded(ctx: Context, task: dict[str, Any], base: Path, path: Path, seen: frozenset[Path]) -> dict[str, list[str]]:
    if "block" in task:
        tasks = [t for section in ("block", "rescue", "always") for t in (task.get(section) or [])]
        return _assigned_in(ctx, tasks, base, path, seen)
    result: dict[str, list[str]] = {}
    for target in _targets(ctx, task, base):
        for name, places in assigned(ctx, target, seen | {path}).items():
            for place in places:
                _note(result, name, place)
    return result


def check_tasks(ctx: Context, tasks: list[dict[str, Any]], base: Path, path: Path) -> None:
    for task in tasks:
        for section in ("block", "rescue", "always"):
            if isinstance(task.get(section), list):
                check_tasks(ctx, task[section], base, path)
        if "when" not in task or not _inherits(task):
            continue
        reads = condition_variables(task["when"])
        set_inside = _guarded(ctx, task, base, path, frozenset())
        shared = sorted(reads & set(set_inside))
        if shared:
            when = task["when"] if isinstance(task["when"], str) else " and ".join(map(str, task["when"]))
            ctx.findings.append(
                Finding(
                    where=f"{path.relative_to(ctx.root)}: {task.get('name', '(unnamed)')}",
                    condition=" ".join(str(when).split()),
                    shared=shared,
                    setters=[place for name in shared for place in set_inside[name]],
                )
            )


def task_files(root: Path) -> list[Path]:
    files = sorted((root / "roles").glob("*/tasks/*.yml")) + sorted((root / "playbooks").rglob("*.yml"))
    return [path for path in files if path.is_file()]


def _play_tasks(data: Any) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """For a playbook: each play's task lists and its `roles:` entries."""
    plays = []
    for play in data if isinstance(data, list) else []:
        if isinstance(play, dict) and "hosts" in play:
            tasks = [t for key in ("pre_tasks", "tasks", "post_tasks", "handlers") for t in (play.get(key) or [])]
            roles = [r for r in (play.get("roles") or []) if isinstance(r, dict)]
            plays.append((tasks, roles))
    return plays


def check(root: Path) -> list[Finding]:
    ctx = Context(root=root.resolve())
    for path in task_files(ctx.root):
        data = yaml.safe_load(path.read_text())
        plays = _play_tasks(data)
        if plays:
            for tasks, roles in plays:
                check_tasks(ctx, tasks, path.parent, path)
                for role in roles:
                    name = role.get("role", role.get("name", ""))
                    if "when" in role and _role_tasks(ctx.root, {"name": name}) is not None:
                        entry = {"name": f"role {name}", "when": role["when"], "import_role": {"name": name}}
                        check_tasks(ctx, [entry], path.parent, path)
        elif isinstance(data, list):
            check_tasks(ctx, [t for t in data if isinstance(t, dict)], path.parent, path)
    return ctx.findings


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    findings = check(root)
    for finding in findings:
        print(finding, file=sys.stderr)
    print(f"conditions: {len(task_files(root.resolve()))} task files checked, {len(findings)} problems")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

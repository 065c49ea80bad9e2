"""Every boolean variable is read as a boolean wherever it is used (tasks, templates, vars).

Role argument specs validate but do not convert: `-e container_runtime_docker_reload=false` and an AWX extra variable
arrive as the string "false", which is true for Jinja (`{% if x %}`, `x and y`, a filter's argument) and which
ansible-core 2.19 refuses as a task condition. A use is right when the variable is
- the operand of `| bool` (directly or through `| default(...)`), or
- tested only for being defined or none (`is none`, `is defined`), or
- the whole value given to a module option of type bool (Ansible converts it: `enabled: "{{ x }}"`, or
  `"{{ x if x is not none else omit }}"`),
and wrong anywhere else (a bare `when: x`, `x and y`, `{% if x %}`, `x | ternary(...)`, a filter's argument, a value
passed on to another role's variable without `| bool`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, nodes
from jinja2.exceptions import TemplateSyntaxError

TEMPLATED = re.compile(r"{{|{%")
# Task keywords whose string value is a bare Jinja expression.
BARE_KEYS = {"when", "changed_when", "failed_when", "until"}
ASSERT = {"assert", "ansible.builtin.assert"}
TASK_KEYWORDS = {
    "name", "when", "changed_when", "failed_when", "until", "retries", "delay", "register", "loop", "loop_control",
    "vars", "tags", "become", "become_user", "delegate_to", "run_once", "check_mode", "diff", "no_log", "notify",
    "block", "rescue", "always", "ignore_errors", "environment", "module_defaults", "args", "listen", "throttle",
    "timeout", "any_errors_fatal", "delegate_facts", "with_items", "local_action", "connection", "ignore_unreachable",
}  # fmt: skip
SAFE_TESTS = {"none", "defined", "undefined"}

_JINJA = Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])


@dataclass(frozen=True)
class Use:
    where: str
    variable: str
    text: str

    def __str__(self) -> str:
        snippet = " ".join(self.text.split())
        snippet = snippet if len(snippet) <= 110 else snippet[:107] + "..."
        return (
            f"{self.where}: {self.variable} is read without `| bool` in `{snippet}` "
            f'(from -e or AWX it is the string "false", which is true)'
        )


def parse(text: str, bare: bool) -> nodes.Template | None:
    source = "{{ " + text + " }}" if bare and not TEMPLATED.search(text) else text
    try:
        return _JINJA.parse(source)
    except TemplateSyntaxError:
        return None


def _value_positions(tree: nodes.Template) -> set[int]:
    """The nodes whose value is the whole template's: its one output, a CondExpr's branches, default()'s operand."""
    outputs = [n for n in tree.body if isinstance(n, nodes.Output)]
    if len(tree.body) != 1 or len(outputs) != 1:
        return set()
    parts = [n for n in outputs[0].nodes if not (isinstance(n, nodes.TemplateData) and not n.data.strip())]
    if len(parts) != 1:
        return set()
    positions: set[int] = set()
    stack = [parts[0]]
    while stack:
        node = stack.pop()
        positions.add(id(node))
        if isinstance(node, nodes.CondExpr):
            stack += [n for n in (node.expr1, node.expr2) if n is not None]
        elif isinstance(node, nodes.Filter) and node.name == "default" and node.node is not None:
            stack.append(node.node)
    return positions


def wrong_uses(tree: nodes.Template, names: set[str], bool_option: bool) -> Iterator[str]:
    """The boolean variables the expression reads other than as a boolean."""
    values = _value_positions(tree) if bool_option else set()

    def walk(node: nodes.Node, parents: tuple[nodes.Node, ...]) -> Iterator[str]:
        read = isinstance(node, nodes.Name) and node.ctx == "load" and node.name in names
        if read and not _read_as_bool(node, parents, values):
            yield node.name
        for child in node.iter_child_nodes():
            yield from walk(child, (*parents, node))

    yield from walk(tree, ())


def _read_as_bool(name: nodes.Name, parents: tuple[nodes.Node, ...], values: set[int]) -> bool:
    node: nodes.Node = name
    chain = list(reversed(parents))
    # Through default(...), the value is still the variable's.
    while chain and isinstance(chain[0], nodes.Filter) and chain[0].name == "default" and chain[0].node is node:
        if id(node) in values:
            return True
        node = chain.pop(0)
    if id(node) in values:
        return True
    parent = chain[0] if chain else None
    if isinstance(parent, nodes.Filter) and parent.name == "bool" and parent.node is node:
        return True
    return isinstance(parent, nodes.Test) and parent.name in SAFE_TESTS and parent.node is node


# ----- where the expressions are ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expression:
    where: str
    text: str
    bare: bool
    module: str | None = None
    option: str | None = None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def task_expressions(tasks: Any, where: str) -> Iterator[Expression]:
    for task in tasks if isinstance(tasks, list) else []:
        if not isinstance(task, dict):
            continue
        here = f"{where}: {task.get('name', '(unnamed)')}"
        for key, value in task.items():
            if key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
                yield from task_expressions(value, where)
            elif key in BARE_KEYS:
                for text in value if isinstance(value, list) else [value]:
                    if isinstance(text, str):
                        yield Expression(here, text, bare=True)
            elif key in ASSERT and isinstance(value, dict):
                that = value.get("that")
                for text in that if isinstance(that, list) else [that]:
                    if isinstance(text, str):
                        yield Expression(here, text, bare=True)
                for option, item in value.items():
                    if option != "that":
                        yield from (Expression(here, t, bare=False) for t in _strings(item))
            elif key in TASK_KEYWORDS or key.startswith("with_"):
                yield from (Expression(here, t, bare=False) for t in _strings(value))
            elif isinstance(value, dict):
                for option, item in value.items():
                    for text in _strings(item):
                        direct = item is text
                        yield Expression(here, text, False, key if direct else None, option if direct else None)
            else:
                yield from (Expression(here, t, bare=False, module=key) for t in _strings(value))


def file_expressions(root: Path) -> Iterator[Expression]:
    """Every Jinja expression of the collection's roles and playbooks (tasks, templates, vars)."""
    for path in sorted((root / "playbooks").rglob("*.yml")) + sorted((root / "roles").glob("*/tasks/**/*.yml")):
        if path.parent.name == "vars":
            yield from _vars_expressions(path, root)
            continue
        data = yaml.safe_load(path.read_text())
        rel = str(path.relative_to(root))
        if isinstance(data, list) and data and isinstance(data[0], dict) and "hosts" in data[0]:
            for play in data:
                here = f"{rel}: play {play.get('name')}"
                for key in ("vars", "module_defaults", "serial", "hosts"):
                    yield from (Expression(here, t, False) for t in _strings(play.get(key)))
                for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                    yield from task_expressions(play.get(key), rel)
        else:
            yield from task_expressions(data, rel)
    for path in sorted((root / "roles").glob("*/vars/**/*.yml")) + sorted((root / "roles").glob("*/defaults/*.yml")):
        yield from _vars_expressions(path, root)
    for path in sorted((root / "roles").glob("*/templates/**/*.j2")) + sorted((root / "playbooks").rglob("*.j2")):
        yield Expression(str(path.relative_to(root)), path.read_text(), bare=False)


def _vars_expressions(path: Path, root: Path) -> Iterator[Expression]:
    data = yaml.safe_load(path.read_text()) or {}
    rel = str(path.relative_to(root))
    for name, value in data.items() if isinstance(data, dict) else []:
        yield from (Expression(f"{rel}: {name}", t, bare=False) for t in _strings(value))


def check(root: Path, booleans: set[str], option_type: Callable[[str, str], str | None]) -> list[str]:
    problems: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    for expression in file_expressions(root):
        if not TEMPLATED.search(expression.text) and not expression.bare:
            continue
        if not any(name in expression.text for name in booleans):
            continue
        tree = parse(expression.text, expression.bare)
        if tree is None:
            continue
        bool_option = bool(
            expression.module and expression.option and option_type(expression.module, expression.option) == "bool"
        )
        for variable in wrong_uses(tree, booleans, bool_option):
            key = (expression.where, variable, expression.text)
            if key not in seen:
                seen.add(key)
                problems.append(str(Use(expression.where, variable, expression.text)))
    return problems


class ModuleOptions:
    """Option types of modules and action plugins, from their documentation (the collection's own too)."""

    def __init__(self, collections_path: str | None, root: Path | None = None) -> None:
        self._cache: dict[str, dict[str, str]] = {}
        self._ready = False
        self._collections_path = collections_path
        self._root = root

    def _init(self) -> None:
        if self._ready:
            return
        import warnings

        from ansible.plugins.loader import init_plugin_loader

        with warnings.catch_warnings():
            # Set up once per process; a second checker in the same process (the unit tests) finds it ready.
            warnings.filterwarnings("ignore", message="AnsibleCollectionFinder has already been configured")
            init_plugin_loader([self._collections_path] if self._collections_path else [])
        self._ready = True

    def __call__(self, module: str, option: str) -> str | None:
        if module not in self._cache:
            self._cache[module] = self._load(module)
        return self._cache[module].get(option)

    def _load(self, module: str) -> dict[str, str]:
        own = module.removeprefix("kubegpu.node.")
        if self._root is not None and own != module:
            # This collection's own: its documentation read from the tree, whatever the loader was set up with.
            return self._own(self._root / "plugins" / "modules" / f"{own}.py")
        self._init()
        from ansible.plugins.loader import fragment_loader, module_loader
        from ansible.utils.plugin_docs import get_docstring

        context = module_loader.find_plugin_with_context(module)
        if not context.resolved or not context.plugin_resolved_path:
            return {}
        doc = get_docstring(
            context.plugin_resolved_path, fragment_loader, collection_name=context.plugin_resolved_collection
        )[0]
        options = (doc or {}).get("options") or {}
        return {name: str((spec or {}).get("type", "str")) for name, spec in options.items()}

    @staticmethod
    def _own(path: Path) -> dict[str, str]:
        if not path.is_file():
            return {}
        tree = ast.parse(path.read_text())
        text = next(
            (
                node.value.value
                for node in tree.body
                if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "DOCUMENTATION" for t in node.targets)
                and isinstance(node.value, ast.Constant)
            ),
            "",
        )
        options = (yaml.safe_load(text) or {}).get("options") or {}
        return {name: str((spec or {}).get("type", "str")) for name, spec in options.items()}

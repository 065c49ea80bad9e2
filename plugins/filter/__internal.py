# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# The collection's private filters: what its own roles and site.yml call, and no user should (docs/architecture.md,
# "Public and private"). They may change or go in any release, and are not documented.
#
# Private by the file's name: ansible-core's plugin listing (`ansible-doc -l`, and with it ansible-test's ansible-doc
# sanity test) skips files whose name starts with two underscores (ansible/plugins/list.py, _list_plugins_from_paths:
# "hidden or python internal file/dir"), while a filter named by its fully qualified name is looked up in every module
# of the collection's filter package (ansible/plugins/loader.py, Jinja2Loader.get_with_context: pkgutil.iter_modules).
# Their names start with an underscore too, so that a call site says it uses an internal.
#
# Each filter only adapts a pure, typed, unit-tested function of plugins/plugin_utils/ to Jinja: the function's
# ValueError (a wrong input) becomes the AnsibleFilterError a task reports (Ansible names the filter).

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.kubegpu.node.plugins.plugin_utils import _mig, _restart_safety, _rollout


def _filter(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except ValueError as error:
            raise AnsibleFilterError(str(error)) from error

    return call


PRIVATE: dict[str, Callable[..., Any]] = {
    # roles/container_runtime/tasks/apply.yml: whether a restart of the runtime would stop running workloads.
    "_restart_safety": _restart_safety.restart_safety,
    # playbooks/site.yml's batch play: the cordon record on a Node, and the message for unreachable hosts.
    "_cordon_record": _rollout.cordon_record,
    "_unreachable_report": _rollout.unreachable_report,
    # playbooks/tasks/preflight.yml: the playbook's and the included role entry points' options as one spec.
    "_entry_point_options": _rollout.entry_point_options,
    # playbooks/site.yml's device plugin step: {node: summary} of the nodes whose GPUs are not healthy.
    "_known_unhealthy": _rollout.known_unhealthy,
    # playbooks/tasks/sharing.yml and device_plugin_sharing.yml: the run's MIG strategy, each MIG node's resources.
    "_gpu_mig_strategy": _mig.strategy_for,
    "_gpu_mig_resources": _mig.resources_by_node,
}


class FilterModule:
    """kubegpu.node's private filters (not listed by ansible-doc)."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {name: _filter(function) for name, function in PRIVATE.items()}

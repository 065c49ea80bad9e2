#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.container_runtime_checks is an action plugin
# (plugins/action/container_runtime_checks.py) that runs on the controller; its decisions are
# plugins/plugin_utils/_container_runtime_checks.py.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: container_runtime_checks
short_description: The checks of the role kubegpu.node.container_runtime (internal to the role)
version_added: 0.1.0
description:
  - Internal to the role C(kubegpu.node.container_runtime) (C(tasks/preflight.yml), C(tasks/main.yml)); its options
    and results may change in any release.
  - Finds the installed container runtimes (C(command -v) of each binary in O(binaries)) and decides which to
    configure - O(engines), or else each installed one except a containerd whose CRI plugin is disabled (Docker CE's
    C(containerd.io)), which C(containerd config dump)'s C(disabled_plugins) line tells; that line is read only when
    O(engines) is empty.
  - Refuses, with one message naming each problem, a runtime in O(engines) that is not installed, no runtime to
    configure (O(state=present)), and O(nvidia_runtime_path) missing or not executable (O(state=present) and
    O(require_nvidia_runtime)).
  - With O(hand_over), the result offers its findings to the role's next run on the host (RV(handover)). That run
    passes the result back as O(found) and, when it was made from the same O(engines) and O(state), takes the
    findings over instead of searching again, and only looks for O(nvidia_runtime_path) again (the toolkit may have
    installed it since); its own result offers nothing, so the hand-over is used once.
  - All of it is one shell command on the node (with the task's C(environment)); a run that takes the findings over
    and does not require O(nvidia_runtime_path) runs none.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
  - kubegpu.node.attributes.reads_only
options:
  state:
    description: The role's C(container_runtime_state).
    type: str
    required: true
    choices: [present, absent]
  engines:
    description: The role's C(container_runtime_engines); empty means each installed runtime.
    type: list
    elements: str
    default: []
  require_nvidia_runtime:
    description: The role's C(container_runtime_require_nvidia_runtime).
    type: bool
    default: true
  nvidia_runtime_path:
    description: The role's C(container_runtime_nvidia_runtime_path).
    type: str
    required: true
  binaries:
    description: The binary whose presence means that a runtime is installed, for each runtime (the role's
      C(__container_runtime_binaries)); the order is the order of RV(installed).
    type: dict
    required: true
  hand_over:
    description: Offer the findings to the role's next run on the host (the role's C(preflight) entry point).
    type: bool
    default: false
  found:
    description: The result of this task's last run on the host (its registered variable), or nothing.
    type: dict
    default: {}
  replay:
    description:
      - With O(hand_over) - what else the playbook C(kubegpu.node.site) needs to read the runtime again at the start
        of the host's batch (M(kubegpu.node.chain_plan)) - containerd's configuration's arguments (C(containerd)),
        its unit (C(containerd_service)), and the role's C(backup_dir) and C(pending_dir). Returned, with these
        checks' own arguments, as RV(replay).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Find the installed container runtimes and check them
  kubegpu.node.container_runtime_checks:
    state: "{{ container_runtime_state }}"
    engines: "{{ container_runtime_engines }}"
    require_nvidia_runtime: "{{ container_runtime_require_nvidia_runtime }}"
    nvidia_runtime_path: "{{ container_runtime_nvidia_runtime_path }}"
    binaries: "{{ __container_runtime_binaries }}"
    found: "{{ __container_runtime_found | default({}) }}"
  register: __container_runtime_found
"""

RETURN = r"""
replay:
  description:
    - With O(hand_over) and O(replay) - O(replay) with these checks' own arguments (C(args)), less those of the
      hand-over.
  returned: when handed over
  type: dict
installed:
  description: The runtimes whose binary was found, in the order of O(binaries).
  returned: success
  type: list
  elements: str
engines:
  description: The runtimes to configure.
  returned: success
  type: list
  elements: str
searched:
  description: Whether this task searched the node for the runtimes (false when it took the preflight's findings over).
  returned: success
  type: bool
start:
  description: When the search these findings come from started (the preflight's, when they were taken over).
  returned: success
  type: str
handover:
  description: With O(hand_over), the inputs the findings were made from (C(engines), C(state)); otherwise empty.
  returned: success
  type: dict
"""

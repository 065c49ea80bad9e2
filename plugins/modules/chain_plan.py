#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.chain_plan is an action plugin (plugins/action/chain_plan.py) that runs on the
# controller; its decisions are plugins/plugin_utils/_chain_plan.py.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: chain_plan
short_description: Which steps of kubegpu.node.site's role chain have anything to do (internal to the playbook)
version_added: 0.1.0
description:
  - Internal to the playbook C(kubegpu.node.site) (its batch play); its options and results may change in any release.
  - Reads each step of the role chain (nvidia_driver, nvidia_container_toolkit, container_runtime, kubelet) again, in
    one task, as the step's role would read it in the same batch - the driver's and the toolkit's plans
    (M(kubegpu.node.nvidia_driver_plan), M(kubegpu.node.nvidia_container_toolkit_plan)), the runtime's checks
    (M(kubegpu.node.container_runtime_checks)) and containerd's configuration (M(kubegpu.node.containerd_config)), the
    kubelet's plan (M(kubegpu.node.kubelet_feature_gates)), the files of the last two compared by
    M(kubegpu.node.service_config) in check mode - with the arguments, and from what, each role's preflight in the
    same run handed over.
  - Returns the steps to include, from the first one with anything to do (a change, a held-back restart or reboot, an
    earlier change noted as pending, a refusal, a kubelet that does not answer) on, in chain order; none on a node in
    place.
  - Conservative - a step it cannot judge has something to do - no preflight result of this run for it, a hand-over
    of an unexpected shape, a read that fails or raises (the role then fails with its own message), Docker or CRI-O
    (planned by the role's own tasks), state absent, CDI without the toolkit's refresh units. A lost connection makes
    the host unreachable, as for any task.
  - Changes nothing on the node.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
  - kubegpu.node.attributes.reads_only
options:
  steps:
    description: The steps of the chain the playbook runs on this host (any order; judged in chain order).
    type: list
    elements: str
    required: true
  plans:
    description:
      - What each role's preflight in this run handed over, by step name - the driver's and the toolkit's C(replay)
        and C(checked), the runtime's checks' whole result (its findings, with C(replay)), the kubelet's C(replay);
        an empty dict, or a null C(replay), where none ran.
    type: dict
    default: {}
  require_nvidia_runtime:
    description: Whether the runtime's checks require nvidia-container-runtime (as the role's batch run is told).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Read each step of the role chain again, to run only those with anything to do
  kubegpu.node.chain_plan:
    steps: [nvidia_driver, nvidia_container_toolkit, container_runtime, kubelet]
    plans:
      nvidia_driver:
        replay: "{{ (__nvidia_driver_plan | default({})).replay | default(none) }}"
        checked: "{{ (__nvidia_driver_plan | default({})).checked | default(none) }}"
      nvidia_container_toolkit:
        replay: "{{ (__nvidia_container_toolkit_plan | default({})).replay | default(none) }}"
        checked: "{{ (__nvidia_container_toolkit_plan | default({})).checked | default(none) }}"
      container_runtime: "{{ __container_runtime_found | default({}) }}"
      kubelet:
        replay: "{{ (__kubelet_plan | default({})).replay | default(none) }}"
  register: __kubegpu_chain
"""

RETURN = r"""
include:
  description: The steps to run, in chain order; empty when none has anything to do.
  returned: success
  type: list
  elements: str
  sample: [container_runtime, kubelet]
reasons:
  description: For each step judged, why it runs (an empty string for a step with nothing to do).
  returned: success
  type: dict
  sample:
    nvidia_driver: ""
    nvidia_container_toolkit: ""
    container_runtime: "containerd.service: a restart is due"
    kubelet: after container_runtime
"""

#!/usr/bin/python
# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health_node
short_description: Mark a Kubernetes node with the health of its GPUs (labels, annotation, an opt-in taint)
version_added: 0.1.0
description:
  - Takes a node's GPU health verdict (the result of M(kubegpu.node.gpu_health), or C(ansible_local.nvidia_health)
    written by the role of the same name) and marks the Node object with it.
  - A node whose verdict is C(degraded) or C(failed) gets the labels C(kubegpu.node/gpu-health) (the verdict) and
    C(kubegpu.node/gpu-health-action) (C(watch), C(reset), C(reboot), C(replace)...) and the annotation
    C(kubegpu.node/gpu-health) (the one-line summary naming the GPUs and the reasons). They are applied by server-side
    apply under a field manager of their own (O(field_manager)), so no label or annotation of another manager is
    touched, and they go away when the node is C(healthy) again (or C(unknown), when its GPUs could not be read).
  - With O(taint), a node at least that bad also gets the taint C(kubegpu.node/gpu-unhealthy=<verdict>:NoSchedule),
    and loses it when it is better again (or when O(taint) is V(none)). C(spec.taints) is an atomic list in the Node
    schema (C(+listType=atomic)), so a server-side apply of it would take every other taint over; the module changes it
    with a JSON patch that first tests that the list is still the one it read, keeps every other taint as it is, and
    plans again from a fresh read when another writer changed the list in between.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.k8s_auth
  - kubegpu.node.attributes
  - kubegpu.node.attributes.k8s
attributes:
  check_mode:
    details: Both writes are sent as server-side dry runs (C(dryRun=All)).
  diff_mode:
    details: Shows the node's health labels, annotation and taint before and after, and the keys of its other taints.
options:
  name:
    description: The Kubernetes node.
    type: str
    required: true
  verdict:
    description:
      - The node's GPU health, as M(kubegpu.node.gpu_health) returns it (C(gpu_health)) - at least C(verdict)
        (C(healthy), C(unknown), C(degraded) or C(failed)); C(action) and C(summary) are used when present.
    type: dict
    required: true
  taint:
    description:
      - V(none) - no taint (and ours is removed where a run put it). V(failed) - taint a node whose GPUs failed.
        V(degraded) - taint a node whose GPUs are degraded or failed.
      - The taint keeps new pods off the node; running pods stay (C(NoSchedule)). Pods that must run there anyway
        tolerate C(kubegpu.node/gpu-unhealthy) (the DCGM exporter that M(kubegpu.node.dcgm_exporter) deploys does).
    type: str
    choices: [none, degraded, failed]
    default: none
  field_manager:
    description: Field manager of the labels, annotation and taint.
    type: str
    default: kubegpu.node-gpu-health
notes:
  - The module belongs to the action group C(kubegpu.node.k8s), so C(module_defaults) can set its connection options
    once with C(group/kubegpu.node.k8s).
  - It runs where the API server can be reached, usually the controller (C(delegate_to=localhost)).
  - Select healthy GPU nodes with node affinity C(kubegpu.node/gpu-health DoesNotExist), or keep off failed ones with
    C(kubegpu.node/gpu-health NotIn [failed]).
seealso:
  - module: kubegpu.node.gpu_health
  - module: kubegpu.node.dcgm_exporter
"""

EXAMPLES = r"""
- name: Read and judge the node's GPUs
  kubegpu.node.gpu_health:
  become: true
  register: health

- name: Label the node, and taint it when a GPU failed
  kubegpu.node.gpu_health_node:
    name: "{{ inventory_hostname }}"
    verdict: "{{ health.gpu_health }}"
    taint: failed
  delegate_to: localhost
"""

RETURN = r"""
node:
  description: The node.
  returned: success
  type: str
  sample: gpu-node-2
verdict:
  description: The verdict the node was marked with.
  returned: success
  type: str
  sample: failed
marks:
  description: The node's health marks after the run (in check mode, as the dry run returned them).
  returned: success
  type: dict
  contains:
    labels:
      description: C(kubegpu.node/gpu-health) and C(kubegpu.node/gpu-health-action), when set.
      type: dict
    annotations:
      description: C(kubegpu.node/gpu-health), when set.
      type: dict
    taint:
      description: The C(kubegpu.node/gpu-unhealthy) taint (C(key), C(value), C(effect)), or null.
      type: dict
    other_taints:
      description: Keys of the node's other taints (left as they were).
      type: list
      elements: str
  sample:
    labels: {"kubegpu.node/gpu-health": "failed", "kubegpu.node/gpu-health-action": "reset"}
    annotations: {"kubegpu.node/gpu-health": "failed (reset): 1 of 4 GPU(s): GPU 2 (00000000:03:00.0): ..."}
    taint: {"key": "kubegpu.node/gpu-unhealthy", "value": "failed", "effect": "NoSchedule"}
    other_taints: ["nvidia.com/gpu"]
api_requests:
  description: Number of HTTP requests sent to the API server.
  returned: always
  type: int
  sample: 3
"""

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import AUTH_ARG_SPEC, kubernetes_module
from ansible_collections.kubegpu.node.plugins.module_utils.gpu_health.marks import FIELD_MANAGER, TAINT_CHOICES
from ansible_collections.kubegpu.node.plugins.module_utils.gpu_health.runner import run_marks

ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    verdict=dict(type="dict", required=True),
    taint=dict(type="str", default="none", choices=list(TAINT_CHOICES)),
    field_manager=dict(type="str", default=FIELD_MANAGER),
    **AUTH_ARG_SPEC,
)


def main() -> None:
    run_marks(kubernetes_module(ARGUMENT_SPEC))


if __name__ == "__main__":
    main()

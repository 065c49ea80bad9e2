#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.gpu_validation is an action plugin (plugins/action/gpu_validation.py) that runs on
# the controller; its logic is plugins/plugin_utils/_gpu_validation.py.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_validation
short_description: The decisions of kubegpu.node.site's GPU validation (internal to the playbook)
version_added: 0.1.0
description:
  - Internal to M(kubegpu.node.site) (C(playbooks/tasks/validate_cluster.yml)); its options and results may change in
    any release. It decides and waits; the playbook creates and deletes the objects with C(kubernetes.core).
  - C(targets) reads each host's C(kubegpu_node_name), C(kubegpu_gpu_count), the GPU count the playbook read from
    the PCI bus (its registered M(kubegpu.node.nvidia_pci_gpus), C(__kubegpu_pci_gpus)) and C(kubegpu_validate)
    (C(all), C(changed) or C(none); C(true) and C(false), also as strings, mean C(all) and C(none), with a
    deprecation warning) and returns the Kubernetes node names, the GPU counts known, each host's
    validation mode and the values it cannot use (also a O(namespace) that is not the validation's own).
  - C(select) decides which nodes this run validates from each host's mode and variables (what the drain window
    applied, C(kubelet_feature_gates_result), the driver version in
    C(ansible_local.nvidia), the toolkit version the playbook read) and the validation record on each Node (the
    C(kubegpu.node/validated) annotation); it names the run (AWX's job id, or random).
  - C(plan) works out each node's free GPUs (allocatable minus what its non-terminated pods request) and the pods of
    its checks; a node with none free is skipped.
  - C(wait) reads the run's pods of one check until each node's is settled or O(timeout) passes, without failing.
  - C(rows) judges each node on its own pods and returns the table, the nodes that passed or failed and the records
    to write.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
  - kubegpu.node.attributes.reads_only
attributes:
  check_mode:
    details: It changes nothing; C(rows) marks the cluster checks as not run in check mode.
options:
  step:
    description: Which decision to make.
    type: str
    required: true
    choices: [targets, select, plan, wait, rows]
  hosts:
    description: The play's hosts (C(ansible_play_hosts_all)); their variables are read from C(hostvars).
    type: list
    elements: str
    default: []
  nodes:
    description: The cluster's Node objects (C(kubernetes.core.k8s_info) resources).
    type: list
    elements: dict
    default: []
  pods:
    description: C(plan). The pods that may hold GPUs on the nodes (any namespace; terminated ones are ignored).
    type: list
    elements: dict
    default: []
  pods_after:
    description: C(rows). The same, read once the checks were over (to tell GPUs taken or freed by other pods).
    type: list
    elements: dict
    default: []
  plugin_changed:
    description: C(select). The device plugin changed in this run, so every node is validated under C(changed).
    type: bool
    default: false
  awx_job_id:
    description: C(select). AWX's job id, which names the run; a random id when unset.
    type: raw
  selection:
    description: C(plan), C(rows). What C(select) returned.
    type: dict
    default: {}
  plan:
    description: C(rows). What C(plan) returned.
    type: dict
    default: {}
  run:
    description: C(plan), C(wait), C(rows). The run's id, from C(select).
    type: str
  namespace:
    description: Where the validation pods run.
    type: str
    default: kubegpu-validation
  image:
    description: C(plan). The validation pods' image.
    type: str
  runtime_class:
    description: C(plan). The validation pods' RuntimeClass.
    type: str
  timeout:
    description: Seconds each wait lasts at most; the pods end themselves after three times this plus a minute.
    type: int
    default: 300
  check:
    description: C(wait). Which check's pods to wait for.
    type: str
    choices: [smi, holder, surplus]
  wait_for:
    description: C(wait). The nodes whose pods to wait for.
    type: list
    elements: str
    default: []
  kubeconfig:
    description: C(wait). Passed to the C(kubernetes.core.k8s) lookup.
    type: raw
  context:
    description: C(wait). Passed to the C(kubernetes.core.k8s) lookup.
    type: str
  waits:
    description: C(rows). What each C(wait) returned, by check.
    type: dict
    default: {}
  logs:
    description: C(rows). The C(kubernetes.core.k8s_log) results of the nvidia-smi pods (a loop's C(results)).
    type: list
    elements: dict
    default: []
  failed_task:
    description: C(rows). The name of the step that made the cluster checks stop early, if one did.
    type: str
  failed_result:
    description: C(rows). That step's result (its message, or the API server's Status in its body, is reported).
    type: dict
"""

EXAMPLES = r"""
- name: Decide which nodes to validate
  kubegpu.node.gpu_validation:
    step: select
    hosts: "{{ ansible_play_hosts_all }}"
    nodes: "{{ __nodes.resources }}"
  register: __selection
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
nodes:
  description: C(targets). The Kubernetes node of each host, in play order.
  returned: step is targets
  type: list
  elements: str
expected:
  description: C(targets). Physical GPUs per node, where known.
  returned: step is targets
  type: dict
modes:
  description: C(targets). Each host's validation mode (all, changed, none).
  returned: step is targets
  type: dict
validating:
  description: C(targets). Whether any host is validated at all.
  returned: step is targets
  type: bool
deprecation_notes:
  description: C(targets). The deprecation notes given (true/false for kubegpu_validate).
  returned: step is targets
  type: list
  elements: str
problems:
  description: C(targets). One sentence per value that cannot be used (a GPU count, a validation mode).
  returned: step is targets
  type: list
  elements: str
validate:
  description: C(select). The nodes to validate, each with the reason.
  returned: step is select
  type: dict
skip:
  description: C(select). The nodes left alone, each with the reason.
  returned: step is select
  type: dict
run:
  description: C(select). The run's id (a label value and a name suffix of its objects).
  returned: step is select
  type: str
  sample: awx-1234
summary:
  description: C(select). A line with the counts, then one per node.
  returned: step is select
  type: list
  elements: str
pods:
  description: C(plan) the pods to create per check; C(wait) the pods as last seen.
  returned: step is plan or wait
  type: raw
usage:
  description: C(plan). Per node, C(allocatable), C(used) by other pods, C(free) and C(holders).
  returned: step is plan
  type: dict
busy:
  description: C(plan). The nodes with no free GPU, and their row text.
  returned: step is plan
  type: dict
waited:
  description: C(wait). Seconds waited.
  returned: step is wait
  type: float
unsettled:
  description: C(wait). The nodes whose pod was still not settled at the end.
  returned: step is wait
  type: list
  elements: str
rows:
  description: C(rows). One row per node validated (node, gpus, host, container, pod, scheduling).
  returned: step is rows
  type: list
  elements: dict
columns:
  description: C(rows). The rows' keys in the order the table shows them.
  returned: step is rows
  type: list
  elements: str
table:
  description: C(rows). The rows as aligned text lines, a header first (site.yml prints them).
  returned: step is rows
  type: list
  elements: str
  sample: ["NODE    GPUS  HOST  CONTAINER  POD  SCHEDULING", "gpu-1   8     ok    ok         ok   ok"]
records:
  description: C(rows). Per node, the validation record to write, or null to remove it.
  returned: step is rows
  type: dict
passed_nodes:
  description: C(rows). The nodes that passed.
  returned: step is rows
  type: list
  elements: str
failed_nodes:
  description: C(rows). The nodes that did not pass.
  returned: step is rows
  type: list
  elements: str
skipped_nodes:
  description: C(rows). The nodes whose checks could not run (no free GPU, GPUs taken or freed meanwhile).
  returned: step is rows
  type: list
  elements: str
message:
  description: C(rows). The run's failure message, empty when every node passed or was skipped.
  returned: step is rows
  type: str
"""

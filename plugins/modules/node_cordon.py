#!/usr/bin/python
# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_cordon
short_description: Cordon a Kubernetes node with a record of who did it and why; uncordon only such a cordon
version_added: 0.1.0
description:
  - Cordons a node (C(spec.unschedulable)) and writes, in the same request, the annotation C(kubegpu.node/cordon) on
    it. The annotation's value is JSON with who cordoned the node (O(owner)), why (O(reason)), when (UTC), and the
    commands that put the node back by hand.
  - With O(state=uncordoned), uncordons the node and removes the annotation in the same request, only when the
    annotation is there. A node cordoned without it (by an operator, by C(kubectl drain), by another tool) stays
    cordoned. A record left on a schedulable node (uncordoned by hand) is removed.
  - Each write carries the C(resourceVersion) the decision was made on. When the node changed in between (its
    kubelet's status, or someone cordoning it at the same moment), the API server refuses the write with 409 Conflict
    and the module reads the node and decides again, so a node someone else cordoned is never marked as this
    module's.
  - Whatever stops a playbook between two API calls, the node has both the cordon and the record, or neither (or the
    record alone, after a hand uncordon), and the next run reads which.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.k8s_auth
  - kubegpu.node.attributes
  - kubegpu.node.attributes.k8s
attributes:
  check_mode:
    details: Reads the node and says what it would write; writes nothing.
  diff_mode:
    details: C(spec.unschedulable) and the annotation, before and after.
options:
  name:
    description: Name of the node.
    type: str
    required: true
  state:
    description:
      - V(cordoned) cordons a schedulable node and records it. A node cordoned already is left as it is, with or
        without a record (a cordon without one is not taken over).
      - V(uncordoned) uncordons the node and removes the record when the record is there; otherwise it changes
        nothing.
    type: str
    required: true
    choices: [cordoned, uncordoned]
  reason:
    description: Why the node is cordoned, for the record (what an operator reads). Required with O(state=cordoned).
    type: str
  owner:
    description: Who cordons it, for the record (for example the playbook and the AWX job).
    type: str
    default: kubegpu.node
notes:
  - The module talks to the API server directly, so it usually runs on the controller (C(delegate_to=localhost)).
  - To keep a node cordoned that this module cordoned, remove the record with C(kubectl annotate node NODE
    kubegpu.node/cordon-). The cordon is then the operator's, and O(state=uncordoned) leaves it.
  - C(kubegpu.node.site) uses it for its drain windows, so that a run cancelled inside a window is finished by the next
    run, and a node an operator cordoned is never uncordoned.
seealso:
  - module: kubernetes.core.k8s_drain
    description: Drains a cordoned node with evictions, which honour PodDisruptionBudgets. It leaves the cordon of a
      node cordoned already as it is.
"""

EXAMPLES = r"""
- name: Cordon the node before maintenance, with a record
  kubegpu.node.node_cordon:
    name: gpu-node-1
    state: cordoned
    reason: driver upgrade (reboot)
    owner: maintenance.yml
  delegate_to: localhost
  register: cordon

- name: Drain it
  kubernetes.core.k8s_drain:
    name: gpu-node-1
    state: drain
    delete_options:
      ignore_daemonsets: true
  delegate_to: localhost

- name: Put it back, unless someone else had cordoned it before
  kubegpu.node.node_cordon:
    name: gpu-node-1
    state: uncordoned
  delegate_to: localhost
"""

RETURN = r"""
action:
  description: What the module did (or would do in check mode).
  returned: success
  type: str
  choices: [cordon, uncordon, forget, none]
  sample: cordon
cordon_before:
  description:
    - The node's cordon as read, V(recorded) (cordoned with the record), V(unrecorded) (cordoned without it, by
      someone else) or V(none) (schedulable).
  returned: success
  type: str
  sample: none
cordon:
  description: The node's cordon afterwards, with the same values as RV(cordon_before).
  returned: success
  type: str
  sample: recorded
record:
  description:
    - The record on the node after a cordon (the one written, or the one an earlier run wrote); the record removed by
      an uncordon; null when there is none.
  returned: success
  type: dict
  sample:
    by: kubegpu.node site.yml
    reason: "held back for a drain window: reboot"
    at: "2026-11-25T19:04:00Z"
    undo: kubectl uncordon gpu-node-1 && kubectl annotate node gpu-node-1 kubegpu.node/cordon-
boot_id:
  description: The node's C(status.nodeInfo.bootID) as read (to tell a reboot afterwards).
  returned: success
  type: str
"""

from datetime import datetime, timezone

from ansible.module_utils.basic import missing_required_lib
from ansible_collections.kubegpu.node.plugins.module_utils._node_cordon import STATES, CordonError, converge
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import (
    AUTH_ARG_SPEC,
    kubeconfig_secrets,
    kubernetes_module,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.client import (
    HAS_KUBERNETES,
    KUBERNETES_IMPORT_ERROR,
    KubeClient,
    load_configuration,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.errors import DevicePluginError

ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    state=dict(type="str", required=True, choices=list(STATES)),
    reason=dict(type="str"),
    owner=dict(type="str", default="kubegpu.node"),
    **AUTH_ARG_SPEC,
)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def main() -> None:
    module = kubernetes_module(ARGUMENT_SPEC, required_if=[("state", "cordoned", ("reason",))])
    if isinstance(module.params.get("kubeconfig"), dict):
        module.no_log_values.update(kubeconfig_secrets(module.params["kubeconfig"]))
    if not HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=str(KUBERNETES_IMPORT_ERROR))
    params = module.params
    try:
        configuration, _source = load_configuration(params)
        if not configuration.verify_ssl:
            module.warn(
                "TLS certificate verification of the API server is disabled (validate_certs=false or an insecure "
                "kubeconfig): the connection can be intercepted; set ca_cert instead"
            )
        result = converge(
            KubeClient(configuration),
            params["name"],
            params["state"],
            params["reason"] or "",
            params["owner"],
            _now,
            check_mode=module.check_mode,
        )
    except (CordonError, DevicePluginError) as error:
        module.fail_json(msg=getattr(error, "msg", None) or str(error))
    diff = result.pop("diff")
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_device_plugin
short_description: Apply the NVIDIA device plugin and wait until nodes report their GPUs
version_added: 0.1.0
description:
  - Applies the NVIDIA k8s-device-plugin as a DaemonSet by server-side apply, with an optional ConfigMap holding the
    plugin's config file and an optional RuntimeClass C(nvidia).
  - When the config shares GPUs with MPS (C(sharing.mps)), also applies NVIDIA's MPS control daemon as NVIDIA's Helm
    chart deploys it, a second DaemonSet from the same image on nodes labelled C(nvidia.com/mps.capable=true). It is
    removed again once the config no longer uses MPS.
  - Validates the plugin config before any API call. Unknown keys, and known keys at the wrong level (which the plugin
    silently ignores), are errors that name the path and where the key belongs.
  - With O(wait=true), waits until each node reports its C(nvidia.com/gpu) capacity, not merely until the DaemonSet's
    pods run. The wait lists nodes once and then watches them, so its API traffic does not grow with the number of
    nodes.
  - On timeout, fails with a diagnosis for each node that is not done, such as a node that is not Ready, a plugin
    pod that a node selector or a taint keeps away, an image pull error, a crash loop, NVML that cannot be loaded
    because the default runtime is not nvidia, no devices found, unhealthy devices, a count different from the
    expected one, a MIG resource in another count than expected, or (MPS) a node whose MPS control daemon does not
    run.
  - With O(state=absent), deletes the objects this module created, the MPS control daemon included. It leaves
    alone objects without its C(app.kubernetes.io/managed-by=kubegpu.node) label.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.k8s_auth
  - kubegpu.node.attributes
  - kubegpu.node.attributes.k8s
attributes:
  check_mode:
    details: Every write is sent as a server-side dry run (C(dryRun=All)), so admission and validation still run. No
      object is created, changed or deleted, and the module does not wait.
  diff_mode:
    details: Shows the before and after state of each object that changes, as the server returns it, without status and
      server bookkeeping fields.
  idempotent:
    details: The module compares each object before and after the apply, ignoring C(resourceVersion),
      C(managedFields), C(generation) and C(status). A second run with the same options reports no change.
options:
  state:
    description:
      - V(present) applies the objects and, with O(wait), waits for GPU capacity.
      - V(absent) deletes the DaemonSet, the MPS control daemon's DaemonSet when there is one, and the ConfigMap, plus
        the RuntimeClass when O(runtime_class) names one.
        Only objects labelled C(app.kubernetes.io/managed-by=kubegpu.node) are deleted.
    type: str
    default: present
    choices: [present, absent]
  namespace:
    description: Namespace of the DaemonSet and the ConfigMap. The namespace must already exist.
    type: str
    default: kube-system
  name:
    description: Name of the DaemonSet. Its pods carry the label C(name=nvidia-device-plugin-ds).
    type: str
    default: nvidia-device-plugin-daemonset
  version:
    description:
      - Release of the device plugin, used as the image tag.
      - The default is V(v0.20.0). Mutually exclusive with O(image).
    type: str
  registry:
    description:
      - Registry and path that serve the C(k8s-device-plugin) image, for example a mirror at an air-gapped site.
      - The default is V(nvcr.io/nvidia). Mutually exclusive with O(image).
    type: str
  image:
    description:
      - Full image reference, in place of O(registry) and O(version) (mutually exclusive with both).
    type: str
  image_pull_policy:
    description: Image pull policy of the plugin's container.
    type: str
    default: IfNotPresent
    choices: [Always, IfNotPresent, Never]
  image_pull_secrets:
    description: Names of Secrets in O(namespace) used to pull the image.
    type: list
    elements: str
    default: []
  node_selector:
    description:
      - Node labels that a node must have to run the plugin, for example C(nvidia.com/gpu.present=true).
      - Without O(expected_gpus) or O(nodes), the wait covers every node that matches this selector, O(affinity) and
        the tolerations.
    type: dict
    default: {}
  affinity:
    description: Pod affinity of the plugin pods, as in a Pod spec.
    type: dict
  tolerations:
    description:
      - Tolerations added to the default one (C(nvidia.com/gpu) Exists NoSchedule).
      - Each item uses the keys of a Kubernetes toleration (C(key), C(operator), C(value), C(effect),
        C(tolerationSeconds)).
    type: list
    elements: dict
    default: []
  priority_class_name:
    description: Priority class of the plugin pods.
    type: str
    default: system-node-critical
  resources:
    description: Resource requests and limits of the plugin's container, as in a container spec.
    type: dict
  config:
    description:
      - The device plugin's config file (C(version) V(v1)) as a mapping. It is stored in the ConfigMap
        O(config_map_name) and passed to the plugin through C(CONFIG_FILE) and a volume. A change rolls the pods.
      - Checked before any API call. C(version) must be V(v1), and C(flags.migStrategy) one of V(none), V(single),
        V(mixed). C(flags.plugin.deviceListStrategy) takes V(envvar), V(volume-mounts), V(cdi-annotations) or
        V(cdi-cri), as a string or a list. C(flags.plugin.deviceIDStrategy) takes V(uuid) or V(index).
        C(replicas) must be at least 2. Every key must be known to the plugin (v0.17 to v0.20) and sit at its
        level.
      - C(sharing.mps) deploys NVIDIA's MPS control daemon beside the plugin, a DaemonSet named O(name) with
        C(-mps-control-daemon) appended. Its pods run privileged, in the host's PID namespace, on nodes labelled
        C(nvidia.com/mps.capable=true) (and matching O(node_selector)). They share the MPS root with the plugin,
        C(flags.mpsRoot) or C(/run/nvidia/mps) on the host, where they mount a shared-memory tmpfs. GPU feature
        discovery sets that label when the config uses MPS, and so does the labels step of C(kubegpu.node.site).
      - MPS is refused with C(flags.migStrategy) V(single) or V(mixed) (the plugin refuses MPS for MIG devices), for
        other resources than C(nvidia.com/gpu), and with C(failRequestsGreaterThanOne) V(false) (releases up to
        v0.20 ignore it under MPS and refuse every request for more than one shared GPU). More than 48 replicas
        per GPU gives a warning (MPS serves at most 48 clients per GPU).
      - With time-slicing or MPS of C(nvidia.com/gpu) in N replicas, each node should report physical GPUs x N,
        under C(nvidia.com/gpu.shared) when C(renameByDefault) is true.
      - Under C(flags.migStrategy) V(single) or V(mixed), the count depends on each GPU's MIG layout, given in
        O(expected_resources). Without that, the wait only requires non-zero capacity equal to allocatable (under
        V(mixed), the C(nvidia.com/mig-*) resources count too). The plugin then gets the MIG monitor capability and
        C(CAP_SYS_ADMIN), as NVIDIA's Helm chart gives it for a MIG strategy.
    type: dict
  config_map_name:
    description: Name of the ConfigMap that holds O(config).
    type: str
    default: nvidia-device-plugin-config
  runtime_class:
    description:
      - V(true) creates the RuntimeClass C(nvidia) (handler C(nvidia)) and runs the plugin under it. A string does the
        same under that name. Use it where nvidia is not the container runtime's default.
      - V(false) creates no RuntimeClass.
    type: raw
    default: false
  force_conflicts:
    description: Take over fields that another field manager owns, instead of failing with a 409 conflict.
    type: bool
    default: false
  field_manager:
    description: Field manager name used for server-side apply.
    type: str
    default: kubegpu.node
  wait:
    description:
      - Wait until each covered node reports its GPU capacity, with allocatable equal to capacity.
      - Ignored in check mode.
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait before failing with a diagnosis per node. Must be positive.
    type: int
    default: 300
  expected_gpus:
    description:
      - Map of node name to the number of physical GPUs the node has (a non-negative integer).
      - The wait then covers exactly these nodes. Each must report physical GPUs x time-slicing replicas. A node with
        V(0) must report none.
      - Mutually exclusive with O(nodes).
    type: dict
  expected_resources:
    description:
      - Map of node name to the extended resources the node must advertise, before sharing, as a map of resource
        name to count. For MIG, the node's MIG devices under the plugin's strategy. Under V(mixed), C(nvidia.com/gpu)
        per GPU without MIG and C(nvidia.com/mig-<profile>) per MIG device, for example 2 x
        C(nvidia.com/mig-1g.10gb) and 1 x C(nvidia.com/mig-3g.40gb); under V(single), C(nvidia.com/gpu) per MIG
        device.
      - Each resource must then be reported exactly, times its replicas and under its shared name when the config
        shares it (time-slicing of a C(nvidia.com/mig-*) resource, C(renameByDefault)), with allocatable equal to
        capacity.
      - The wait covers these nodes, plus those of O(expected_gpus) or O(nodes); a node named twice follows this
        option. C(kubegpu.node.site) computes each node's entry from the C(kubegpu.node.gpu_mig) role's
        facts.
    type: dict
  nodes:
    description:
      - Names of the nodes the wait covers when O(expected_gpus) is not given. Each must report non-zero capacity.
      - Without this option or O(expected_gpus), the wait covers every node where the plugin would be scheduled.
    type: list
    elements: str
  known_unhealthy:
    description:
      - Map of node name to what is known to be wrong with its GPUs (for example the summary of
        M(kubegpu.node.gpu_health)). On a wait timeout, that node's diagnosis ends with it.
    type: dict
    default: {}
notes:
  - The module talks to the API server directly, so it usually runs on the controller (C(delegate_to=localhost),
    C(run_once=true)).
  - The pods run with C(FAIL_ON_INIT_ERROR=false), as in NVIDIA's static manifest, so a node without usable GPUs
    keeps a running pod whose log explains why. Setting C(flags.failOnInitError) in O(config) takes precedence.
  - Each node is checked against its own Ready condition and C(status.capacity) and C(status.allocatable), so a node
    whose plugin runs but advertises nothing is never reported as ready.
  - O(wait_timeout) bounds the whole wait whatever the API server does, and also the retries of each API call.
    Answers 429 (throttled) and 5xx are retried, never sooner than the server's C(Retry-After), otherwise with
    exponential backoff and jitter. A watch that ends early or fails is resumed after a backoff, and nodes are never
    listed more than once a second. At the deadline the nodes still pending are read once more (with 10 seconds of
    its own) before they are judged, so that a server that throttled every watch does not make the module blame a
    node that reported its GPUs meanwhile.
  - The module belongs to the action group C(kubegpu.node.k8s), so C(module_defaults) can set its connection options
    once with C(group/kubegpu.node.k8s). The options it shares with C(kubernetes.core) (O(host), O(api_key),
    O(kubeconfig), O(context), O(validate_certs), O(ca_cert), O(client_cert), O(client_key), O(proxy)) have the same
    names, aliases and E(K8S_AUTH_*) variables, so one set of values can serve both groups.
seealso:
  - module: kubernetes.core.k8s
  - name: NVIDIA k8s-device-plugin
    description: The device plugin this module deploys.
    link: https://github.com/NVIDIA/k8s-device-plugin
"""

EXAMPLES = r"""
- name: Deploy the device plugin and wait for every GPU node
  kubegpu.node.nvidia_device_plugin:
    node_selector:
      nvidia.com/gpu.present: "true"
  delegate_to: localhost
  run_once: true

- name: Deploy with time-slicing (4 replicas) and check each node's count
  kubegpu.node.nvidia_device_plugin:
    kubeconfig: /etc/kubernetes/admin.conf
    config:
      version: v1
      sharing:
        timeSlicing:
          resources:
            - name: nvidia.com/gpu
              replicas: 4
    expected_gpus:
      gpu-node-1: 8
      gpu-node-2: 4
    wait_timeout: 600
  delegate_to: localhost
  run_once: true

- name: Share each GPU between 4 pods with MPS (the MPS control daemon runs on nodes labelled nvidia.com/mps.capable)
  kubegpu.node.nvidia_device_plugin:
    config:
      version: v1
      sharing:
        mps:
          resources:
            - name: nvidia.com/gpu
              replicas: 4
    expected_gpus:
      gpu-node-1: 2
  delegate_to: localhost
  run_once: true

- name: MIG (mixed strategy), each node's MIG devices checked
  kubegpu.node.nvidia_device_plugin:
    config:
      version: v1
      flags:
        migStrategy: mixed
    expected_resources:
      gpu-node-3:
        nvidia.com/mig-1g.10gb: 2
        nvidia.com/mig-2g.20gb: 1
        nvidia.com/mig-3g.40gb: 1
  delegate_to: localhost
  run_once: true

- name: Run the plugin under a RuntimeClass where nvidia is not the default runtime
  kubegpu.node.nvidia_device_plugin:
    runtime_class: true
    nodes: [gpu-node-1]
  delegate_to: localhost
  run_once: true

- name: Air-gapped site, private registry, token authentication
  kubegpu.node.nvidia_device_plugin:
    host: https://10.0.0.1:6443
    api_key: "{{ vault_k8s_token }}"
    ca_cert: /etc/kubernetes/pki/ca.crt
    registry: registry.example.internal/nvidia
    version: v0.20.0
    image_pull_secrets: [registry-credentials]
  delegate_to: localhost
  run_once: true

- name: Remove what the module created
  kubegpu.node.nvidia_device_plugin:
    state: absent
    runtime_class: true
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
objects:
  description: Each object the module applied or deleted, and what happened to it.
  returned: always
  type: list
  elements: dict
  contains:
    kind:
      description: Kind of the object.
      type: str
      sample: DaemonSet
    name:
      description: Name of the object.
      type: str
      sample: nvidia-device-plugin-daemonset
    namespace:
      description: Namespace of the object (absent for a RuntimeClass).
      type: str
      sample: kube-system
    action:
      description: One of created, updated, unchanged, deleted, absent (nothing to delete) or kept (not ours).
      type: str
      sample: updated
    changed:
      description: Whether the object changed.
      type: bool
    changed_fields:
      description: Dotted paths of the fields that changed, for an updated object.
      type: list
      elements: str
      sample: [spec.template.spec.containers]
  sample:
    - kind: DaemonSet
      name: nvidia-device-plugin-daemonset
      namespace: kube-system
      action: created
      changed: true
      changed_fields: []
nodes:
  description: GPU capacity per node covered by the wait (empty when the module did not wait).
  returned: always
  type: dict
  contains:
    capacity:
      description: The node's C(status.capacity) of the counted resource (RV(nodes.resource)).
      type: int
    allocatable:
      description: The node's C(status.allocatable) of the counted resource (RV(nodes.resource)).
      type: int
    expected:
      description: The count the node must report (physical GPUs x replicas), or null when only non-zero is required.
      type: int
    resource:
      description: The resource the wait counts, C(nvidia.com/gpu) or C(nvidia.com/gpu.shared).
      type: str
    ready:
      description: Whether the node is done (Ready, and its capacity is as required and equal to allocatable).
      type: bool
    found:
      description: Whether the node exists.
      type: bool
    node_ready:
      description: The node's Ready condition.
      type: bool
    resources:
      description:
        - Under MIG C(mixed), the capacity and allocatable of each resource counted (C(nvidia.com/gpu) and each
          C(nvidia.com/mig-*)).
        - For a node of O(expected_resources), each expected resource with its C(capacity), C(allocatable) and
          C(expected) count (after sharing).
      type: dict
      returned: under MIG mixed, or for a node of O(expected_resources)
      sample: {"nvidia.com/mig-1g.10gb": {"capacity": 14, "allocatable": 14, "expected": 14}}
  sample:
    gpu-node-1:
      capacity: 32
      allocatable: 32
      expected: 32
      resource: nvidia.com/gpu
      ready: true
      found: true
      node_ready: true
daemonset:
  description: Status counters of the DaemonSet after the apply, or after the wait when the module waited.
  returned: when state=present
  type: dict
  sample:
    desiredNumberScheduled: 2
    currentNumberScheduled: 2
    updatedNumberScheduled: 2
    numberReady: 2
    numberAvailable: 2
    numberUnavailable: 0
    numberMisscheduled: 0
    observedGeneration: 1
waited:
  description: Seconds spent waiting for capacity (0 when the module did not wait).
  returned: always
  type: float
  sample: 12.4
diagnosis:
  description: On a wait timeout, one message per node that is not done.
  returned: on wait timeout
  type: list
  elements: str
  sample:
    - "gpu-node-2: node reports no nvidia.com/gpu: the plugin cannot load NVML: ..."
config_errors:
  description: Every problem found in O(config), each naming its path.
  returned: when the config is invalid
  type: list
  elements: str
  sample:
    - >-
      flags.renameByDefault: 'renameByDefault' is not valid under flags; it belongs at
      sharing.timeSlicing.renameByDefault or sharing.mps.renameByDefault
api_requests:
  description: Number of HTTP requests the module sent to the API server (retries included).
  returned: always
  type: int
  sample: 7
api_throttled:
  description: How many of those requests the API server answered with 429 (throttled).
  returned: always
  type: int
  sample: 0
option_errors:
  description: Every problem found in the options, before any API call.
  returned: when the options are invalid
  type: list
  elements: str
  sample:
    - "wait_timeout: must be a positive number of seconds, not 0"
status:
  description: HTTP status of a failed API request.
  returned: on API failure
  type: int
  sample: 403
reason:
  description: Reason of a failed API request, as the API server gave it.
  returned: on API failure
  type: str
  sample: Forbidden
api_message:
  description: The message of the API server's C(Status) answer to a failed request.
  returned: on API failure
  type: str
  sample: 'daemonsets.apps is forbidden: User "ci" cannot patch resource "daemonsets"'
url:
  description: The API server address that could not be reached.
  returned: when the API server cannot be reached
  type: str
  sample: https://10.0.0.1:6443
"""

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import (
    ARGUMENT_SPEC,
    MUTUALLY_EXCLUSIVE,
    kubernetes_module,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.runner import run_module


def main() -> None:
    run_module(kubernetes_module(ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE))


if __name__ == "__main__":
    main()

#!/usr/bin/python
# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dcgm_exporter
short_description: Deploy NVIDIA's DCGM exporter on the GPU nodes and wait until it runs on each
version_added: 0.1.0
description:
  - Applies NVIDIA's DCGM exporter (GPU metrics for Prometheus) as a DaemonSet by server-side apply - a pinned image
    (O(version), or O(registry) for an air-gapped mirror, or O(image)), the metrics port (O(port), named C(metrics)),
    the kubelet's pod-resources folder mounted read-only so that each GPU's metrics carry the pod, namespace and
    container using it, root with C(SYS_ADMIN) for the profiling metrics (O(profiling_metrics)), every other
    capability dropped.
  - It runs on the nodes O(node_selector) selects (by default C(nvidia.com/gpu.present=true)), tolerating
    C(nvidia.com/gpu) and the GPU health taint C(kubegpu.node/gpu-unhealthy) - a sick GPU's metrics matter most.
  - With O(service) a ClusterIP Service on the metrics port; with O(service_monitor) a Prometheus Operator
    ServiceMonitor - by default (V(auto)) when the cluster has that CRD (C(monitoring.coreos.com/v1)). A Service or
    ServiceMonitor turned off is deleted when this collection made it.
  - With O(wait), waits until a Ready pod of the current template runs on every covered node (O(nodes), else every
    node the DaemonSet selects), and on timeout fails with a reason per node - not Ready, no pod (which selector label
    or taint keeps it away), image pull error, crash loop, or running but not Ready (DCGM cannot reach the GPUs).
  - With O(state=absent), deletes the DaemonSet, Service and ServiceMonitor this module made (labelled
    C(app.kubernetes.io/managed-by=kubegpu.node)).
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.k8s_auth
  - kubegpu.node.attributes
  - kubegpu.node.attributes.k8s
attributes:
  check_mode:
    details: Every write is a server-side dry run (C(dryRun=All)); the module does not wait.
  diff_mode:
    details: The before and after of each object that changes, as the server returns them, without status and server
      bookkeeping.
options:
  state:
    description: V(present) applies (and with O(wait) waits); V(absent) deletes what this module made.
    type: str
    choices: [present, absent]
    default: present
  namespace:
    description: Namespace of the DaemonSet, Service and ServiceMonitor (it must exist).
    type: str
    default: kube-system
  name:
    description: Name of the DaemonSet, Service and ServiceMonitor.
    type: str
    default: dcgm-exporter
  version:
    description: The image tag (DCGM version - exporter version). The default is V(4.5.3-4.8.2-distroless).
    type: str
  registry:
    description: Registry and path that serve the C(dcgm-exporter) image (an air-gapped mirror). The default is
      V(nvcr.io/nvidia/k8s).
    type: str
  image:
    description: The full image reference, instead of O(registry) and O(version).
    type: str
  image_pull_policy:
    description: Pull policy of the exporter's container.
    type: str
    choices: [Always, IfNotPresent, Never]
    default: IfNotPresent
  image_pull_secrets:
    description: Secrets in O(namespace) to pull the image with.
    type: list
    elements: str
    default: []
  node_selector:
    description: Labels a node needs to run the exporter. The default selects C(nvidia.com/gpu.present=true); V({})
      selects every node.
    type: dict
  tolerations:
    description: Tolerations added to C(nvidia.com/gpu) and C(kubegpu.node/gpu-unhealthy) (Exists, NoSchedule).
    type: list
    elements: dict
    default: []
  runtime_class:
    description: RuntimeClass to run under (for example V(nvidia), where nvidia is not the runtime's default).
    type: str
  priority_class_name:
    description: Priority class of the exporter's pods.
    type: str
    default: system-node-critical
  resources:
    description: Requests and limits of the exporter's container (default 100m/128Mi, limits 200m/512Mi).
    type: dict
  port:
    description: The metrics port.
    type: int
    default: 9400
  profiling_metrics:
    description: Give the container C(SYS_ADMIN), which DCGM's profiling metrics (C(DCGM_FI_PROF_*)) need.
    type: bool
    default: true
  service:
    description: A ClusterIP Service on the metrics port (also made when a ServiceMonitor is).
    type: bool
    default: true
  service_monitor:
    description: A Prometheus Operator ServiceMonitor - V(auto) when the cluster has the CRD, V(true) (fail without the
      CRD), V(false).
    type: str
    choices: [auto, "true", "false"]
    default: auto
  service_monitor_interval:
    description: How often Prometheus scrapes.
    type: str
    default: 15s
  service_monitor_labels:
    description: Labels added to the ServiceMonitor (a Prometheus selects ServiceMonitors by label, for example
      C(release=prometheus)).
    type: dict
    default: {}
  field_manager:
    description: Field manager of the server-side apply.
    type: str
    default: kubegpu.node-dcgm-exporter
  force_conflicts:
    description: Take over fields another field manager owns instead of failing with a conflict.
    type: bool
    default: false
  wait:
    description: Wait until the exporter runs, Ready, on every covered node. Ignored in check mode.
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait before failing with a reason per node; also bounds each API call's retries.
    type: int
    default: 300
  nodes:
    description: The nodes that must run the exporter. Without it, every node the DaemonSet selects.
    type: list
    elements: str
notes:
  - The module belongs to the action group C(kubegpu.node.k8s), so C(module_defaults) can set its connection options
    once with C(group/kubegpu.node.k8s).
  - It runs where the API server can be reached, usually the controller (C(delegate_to=localhost), C(run_once=true)).
  - The exporter needs the GPUs in its container - the nvidia runtime as the node's default runtime, or
    O(runtime_class).
seealso:
  - module: kubegpu.node.nvidia_device_plugin
  - module: kubegpu.node.gpu_health_node
  - name: NVIDIA DCGM exporter
    description: The exporter this module deploys, its metrics and its Helm chart.
    link: https://github.com/NVIDIA/dcgm-exporter
"""

EXAMPLES = r"""
- name: Deploy the DCGM exporter on the GPU nodes and wait for it
  kubegpu.node.dcgm_exporter:
    nodes: [gpu-node-1, gpu-node-2]
  delegate_to: localhost
  run_once: true

- name: From an air-gapped mirror, with a ServiceMonitor for a Prometheus that selects release=prometheus
  kubegpu.node.dcgm_exporter:
    registry: registry.example.internal/nvidia/k8s
    image_pull_secrets: [registry-credentials]
    service_monitor: "true"
    service_monitor_labels:
      release: prometheus
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
objects:
  description: Each object applied or deleted - C(kind), C(name), C(namespace), C(action) (created, updated,
    unchanged, deleted, kept), C(changed), C(changed_fields).
  returned: always
  type: list
  elements: dict
service_monitor:
  description: Whether a ServiceMonitor was applied.
  returned: success
  type: bool
nodes:
  description: Per covered node, C(ready) and, when not, C(reason).
  returned: when the module waited
  type: dict
  sample: {"gpu-node-1": {"ready": true, "reason": ""}}
waited:
  description: Seconds spent waiting.
  returned: when the module waited
  type: float
diagnosis:
  description: On a wait timeout, one line per node that is not ready.
  returned: on wait timeout
  type: list
  elements: str
  sample: ["gpu-node-2: pod dcgm-exporter-x7k2p cannot start: image pull error (ImagePullBackOff) for ..."]
api_requests:
  description: Number of HTTP requests sent to the API server.
  returned: always
  type: int
"""

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import AUTH_ARG_SPEC, kubernetes_module
from ansible_collections.kubegpu.node.plugins.module_utils.gpu_health import exporter
from ansible_collections.kubegpu.node.plugins.module_utils.gpu_health.runner import run_exporter

ARGUMENT_SPEC = dict(
    state=dict(type="str", default="present", choices=["present", "absent"]),
    namespace=dict(type="str", default=exporter.DEFAULT_NAMESPACE),
    name=dict(type="str", default=exporter.DEFAULT_NAME),
    version=dict(type="str"),
    registry=dict(type="str"),
    image=dict(type="str"),
    image_pull_policy=dict(type="str", default="IfNotPresent", choices=["Always", "IfNotPresent", "Never"]),
    image_pull_secrets=dict(type="list", elements="str", default=[], no_log=False),
    node_selector=dict(type="dict"),
    tolerations=dict(type="list", elements="dict", default=[]),
    runtime_class=dict(type="str"),
    priority_class_name=dict(type="str", default="system-node-critical"),
    resources=dict(type="dict"),
    port=dict(type="int", default=exporter.DEFAULT_PORT),
    profiling_metrics=dict(type="bool", default=True),
    service=dict(type="bool", default=True),
    service_monitor=dict(type="str", default="auto", choices=["auto", "true", "false"]),
    service_monitor_interval=dict(type="str", default="15s"),
    service_monitor_labels=dict(type="dict", default={}),
    field_manager=dict(type="str", default=exporter.DEFAULT_FIELD_MANAGER),
    force_conflicts=dict(type="bool", default=False),
    wait=dict(type="bool", default=True),
    wait_timeout=dict(type="int", default=300),
    nodes=dict(type="list", elements="str"),
    **AUTH_ARG_SPEC,
)


def main() -> None:
    run_exporter(kubernetes_module(ARGUMENT_SPEC))


if __name__ == "__main__":
    main()

"""Rendering of the DaemonSet, ConfigMap and RuntimeClass."""

from __future__ import annotations

import pytest
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import ARGUMENT_SPEC
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.manifests import (
    object_path,
    removal_targets,
    render_objects,
    stale_targets,
)


def params(**overrides):
    values = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    values.update(overrides)
    return values


def _daemonset(objects):
    return next(obj for obj in objects if obj["kind"] == "DaemonSet")


def test_default_daemonset_matches_nvidia_static_manifest():
    (daemonset,) = render_objects(params())
    assert object_path(daemonset) == "/apis/apps/v1/namespaces/kube-system/daemonsets/nvidia-device-plugin-daemonset"
    spec = daemonset["spec"]
    assert spec["selector"] == {"matchLabels": {"name": "nvidia-device-plugin-ds"}}
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    pod = spec["template"]["spec"]
    assert spec["template"]["metadata"]["labels"] == {"name": "nvidia-device-plugin-ds"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "system-node-critical"
    (container,) = pod["containers"]
    assert container["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert container["env"] == [{"name": "FAIL_ON_INIT_ERROR", "value": "false"}]
    assert pod["volumes"] == [
        {
            "name": "kubelet-device-plugins-dir",
            "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"},
        }
    ]
    for absent in ("nodeSelector", "affinity", "runtimeClassName", "imagePullSecrets"):
        assert absent not in pod
    assert daemonset["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubegpu.node"


def test_image_from_version_and_registry():
    pod = _daemonset(render_objects(params(version="v0.17.1", registry="registry.local:5000/mirror/")))["spec"][
        "template"
    ]["spec"]
    assert pod["containers"][0]["image"] == "registry.local:5000/mirror/k8s-device-plugin:v0.17.1"
    pod = _daemonset(render_objects(params(image="example.org/dp@sha256:" + "a" * 64)))["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "example.org/dp@sha256:" + "a" * 64


def test_scheduling_options_are_rendered():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    pod = _daemonset(
        render_objects(
            params(
                node_selector={"nvidia.com/gpu.present": "true"},
                affinity=affinity,
                tolerations=[{"key": "dedicated", "operator": "Exists"}],
                resources={"limits": {"memory": "128Mi"}},
                priority_class_name="gpu-critical",
                image_pull_secrets=["pull"],
                image_pull_policy="Always",
            )
        )
    )["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["affinity"] == affinity
    assert pod["tolerations"][1] == {"key": "dedicated", "operator": "Exists"}
    assert pod["priorityClassName"] == "gpu-critical"
    assert pod["imagePullSecrets"] == [{"name": "pull"}]
    assert pod["containers"][0]["resources"] == {"limits": {"memory": "128Mi"}}
    assert pod["containers"][0]["imagePullPolicy"] == "Always"


def test_config_is_wired_through_config_map():
    config = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    objects = render_objects(params(config=config, config_map_name="dp-config"))
    assert [obj["kind"] for obj in objects] == ["ConfigMap", "DaemonSet"]
    config_map = objects[0]
    assert object_path(config_map) == "/api/v1/namespaces/kube-system/configmaps/dp-config"
    assert '"replicas": 4' in config_map["data"]["config.yaml"]
    template = objects[1]["spec"]["template"]
    container = template["spec"]["containers"][0]
    assert {"name": "CONFIG_FILE", "value": "/etc/nvidia-device-plugin/config.yaml"} in container["env"]
    assert {"name": "device-plugin-config", "configMap": {"name": "dp-config"}} in template["spec"]["volumes"]
    assert {"name": "device-plugin-config", "mountPath": "/etc/nvidia-device-plugin", "readOnly": True} in container[
        "volumeMounts"
    ]
    digest = template["metadata"]["annotations"]["kubegpu.node/config-sha256"]
    changed = render_objects(params(config=dict(config, flags={"migStrategy": "none"}), config_map_name="dp-config"))
    assert changed[1]["spec"]["template"]["metadata"]["annotations"]["kubegpu.node/config-sha256"] != digest


def test_fail_on_init_error_in_config_is_not_shadowed_by_env():
    daemonset = _daemonset(render_objects(params(config={"version": "v1", "flags": {"failOnInitError": True}})))
    names = [env["name"] for env in daemonset["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert names == ["CONFIG_FILE"]


def test_runtime_class():
    objects = render_objects(params(runtime_class=True))
    assert objects[0] == {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {
            "name": "nvidia",
            "labels": {
                "app.kubernetes.io/name": "nvidia-device-plugin",
                "app.kubernetes.io/managed-by": "kubegpu.node",
                "app.kubernetes.io/version": "v0.20.0",
            },
        },
        "handler": "nvidia",
    }
    assert object_path(objects[0]) == "/apis/node.k8s.io/v1/runtimeclasses/nvidia"
    assert _daemonset(objects)["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    named = render_objects(params(runtime_class="nvidia-legacy"))
    assert named[0]["metadata"]["name"] == "nvidia-legacy"
    assert _daemonset(named)["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia-legacy"


def test_rendering_is_deterministic():
    assert render_objects(params(config={"version": "v1"})) == render_objects(params(config={"version": "v1"}))


def test_removal_targets():
    names = [(t["kind"], t["metadata"]["name"]) for t in removal_targets(params())]
    assert names == [
        ("DaemonSet", "nvidia-device-plugin-daemonset"),
        ("DaemonSet", "nvidia-device-plugin-daemonset-mps-control-daemon"),
        ("ConfigMap", "nvidia-device-plugin-config"),
    ]
    assert [t["kind"] for t in removal_targets(params(runtime_class=True))][-1] == "RuntimeClass"


# MPS: the control daemon beside the plugin, as NVIDIA's Helm chart deploys it ------------------------------------

MPS = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}


def _volumes(pod):
    return {volume["name"]: volume for volume in pod["volumes"]}


def _mounts(container):
    return {mount["name"]: mount for mount in container["volumeMounts"]}


def test_mps_renders_the_control_daemon_before_the_plugin():
    objects = render_objects(params(config=MPS, node_selector={"pool": "a"}, tolerations=[{"key": "x"}]))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ConfigMap", "nvidia-device-plugin-config"),
        ("DaemonSet", "nvidia-device-plugin-daemonset-mps-control-daemon"),
        ("DaemonSet", "nvidia-device-plugin-daemonset"),
    ]
    daemon, plugin = objects[1], objects[2]
    pod = daemon["spec"]["template"]["spec"]
    assert daemon["spec"]["selector"] == {"matchLabels": {"name": "nvidia-device-plugin-mps-control-daemon"}}
    assert daemon["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubegpu.node"
    # Only on nodes GPU feature discovery (or site.yml's labels) marks as MPS capable, within the plugin's selector.
    assert pod["nodeSelector"] == {"nvidia.com/mps.capable": "true", "pool": "a"}
    assert pod["hostPID"] is True
    assert pod["tolerations"] == plugin["spec"]["template"]["spec"]["tolerations"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["mps-control-daemon", "mount-shm"]
    assert init["securityContext"] == {"privileged": True}
    assert init["volumeMounts"] == [{"name": "mps-root", "mountPath": "/mps", "mountPropagation": "Bidirectional"}]
    (container,) = pod["containers"]
    assert container["command"] == ["mps-control-daemon"]
    assert container["image"] == init["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert container["securityContext"] == {"privileged": True}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["CONFIG_FILE"] == "/etc/nvidia-device-plugin/config.yaml"
    assert env["NODE_NAME"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert _volumes(pod)["mps-root"]["hostPath"] == {"path": "/run/nvidia/mps", "type": "DirectoryOrCreate"}
    assert _volumes(pod)["mps-shm"]["hostPath"] == {"path": "/run/nvidia/mps/shm"}
    assert _mounts(container)["mps-shm"]["mountPath"] == "/dev/shm"
    assert _mounts(container)["mps-root"]["mountPath"] == "/mps"
    # The daemon rolls with the config, as the plugin does.
    digest = daemon["spec"]["template"]["metadata"]["annotations"]["kubegpu.node/config-sha256"]
    assert digest == plugin["spec"]["template"]["metadata"]["annotations"]["kubegpu.node/config-sha256"]


def test_under_mps_the_plugin_meets_the_daemon_under_the_mps_root():
    config = dict(MPS, flags={"mpsRoot": "/var/run/mps/"})
    plugin = _daemonset(render_objects(params(config=config))[::-1])
    pod = plugin["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "MPS_ROOT", "value": "/var/run/mps"} in container["env"]
    assert _volumes(pod)["mps-root"]["hostPath"]["path"] == "/var/run/mps"
    assert _volumes(pod)["mps-shm"]["hostPath"]["path"] == "/var/run/mps/shm"
    assert _mounts(container)["mps-root"]["mountPath"] == "/mps"
    # The plugin itself stays unprivileged.
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_without_mps_nothing_of_it_is_rendered_and_an_old_daemon_is_stale():
    time_slicing = {
        "version": "v1",
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
    }
    objects = render_objects(params(config=time_slicing))
    assert [o["kind"] for o in objects] == ["ConfigMap", "DaemonSet"]
    pod = objects[-1]["spec"]["template"]["spec"]
    assert "mps-root" not in _volumes(pod)
    assert [t["metadata"]["name"] for t in stale_targets(params(config=time_slicing))] == [
        "nvidia-device-plugin-daemonset-mps-control-daemon"
    ]
    assert stale_targets(params(config=MPS)) == []


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_a_mig_strategy_gives_the_plugin_the_mig_monitor_as_the_chart_does(strategy):
    plugin = _daemonset(render_objects(params(config={"version": "v1", "flags": {"migStrategy": strategy}})))
    (container,) = plugin["spec"]["template"]["spec"]["containers"]
    assert {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"} in container["env"]
    # CAP_SYS_ADMIN and allowPrivilegeEscalation=false cannot go together (the API refuses it).
    assert container["securityContext"] == {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}
    none = _daemonset(render_objects(params(config={"version": "v1", "flags": {"migStrategy": "none"}})))
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in str(none)

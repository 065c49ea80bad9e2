"""The simulator against the unmodified ``kubernetes`` Python client: the wire behaviour a module relies on."""

from __future__ import annotations

import json
import ssl
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubesim import SimCluster
from sim_objects import DAEMONSET, daemonset, server_side_apply


def _configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def _status(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


def test_discovery_lists_the_simulated_groups(api_client: client.ApiClient) -> None:
    groups = client.ApisApi(api_client).get_api_versions()
    assert {g.name for g in groups.groups} >= {"apps", "node.k8s.io"}
    resources = client.CoreV1Api(api_client).get_api_resources()
    assert {"nodes", "pods", "pods/log", "configmaps", "namespaces"} <= {r.name for r in resources.resources}
    assert client.VersionApi(api_client).get_code().git_version.startswith("v1.")


def test_objects_carry_server_metadata(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map("default", _configmap("meta", a="1"))
    meta = created.metadata
    assert meta.uid and meta.creation_timestamp and meta.generation == 1
    assert int(meta.resource_version) > 0
    assert meta.managed_fields[0].operation == "Update"


def test_watch_from_resource_version_sees_each_change(core: client.CoreV1Api) -> None:
    start = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", _configmap("watched", a="1"))
    core.patch_namespaced_config_map("watched", "default", {"data": {"a": "2"}})
    core.delete_namespaced_config_map("watched", "default")
    seen = []
    for event in watch.Watch().stream(
        core.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=1
    ):
        seen.append((event["type"], event["object"].data))
        if len(seen) == 3:
            break
    assert seen == [("ADDED", {"a": "1"}), ("MODIFIED", {"a": "2"}), ("DELETED", {"a": "2"})]


def test_resource_versions_increase_monotonically(core: client.CoreV1Api) -> None:
    first = core.create_namespaced_config_map("default", _configmap("rv-1"))
    second = core.create_namespaced_config_map("default", _configmap("rv-2"))
    listed = core.list_namespaced_config_map("default")
    assert int(first.metadata.resource_version) < int(second.metadata.resource_version)
    assert int(listed.metadata.resource_version) >= int(second.metadata.resource_version)


def test_watch_from_expired_resource_version_gets_410(cluster: SimCluster, core: client.CoreV1Api) -> None:
    stale = core.list_node().metadata.resource_version
    core.create_namespaced_config_map("default", _configmap("after"))
    cluster.compact()
    with pytest.raises(ApiException) as caught:
        for _event in watch.Watch().stream(core.list_node, resource_version=stale, timeout_seconds=1):
            pass
    assert caught.value.status == 410
    # A fresh list gives a position the client can watch from again.
    fresh = core.list_node().metadata.resource_version
    events = list(watch.Watch().stream(core.list_node, resource_version=fresh, timeout_seconds=1))
    assert events == []


def test_expired_resource_version_as_http_410(kubeconfig: str) -> None:
    with SimCluster(tls=False, gone_as_http=True) as sim:
        http = urllib3.PoolManager()
        headers = {"Authorization": "Bearer test-token"}
        sim.compact()
        watch_answer = http.request("GET", f"{sim.url}/api/v1/nodes?watch=1&resourceVersion=1", headers=headers)
        list_answer = http.request(
            "GET", f"{sim.url}/api/v1/nodes?resourceVersion=1&resourceVersionMatch=Exact", headers=headers
        )
    for answer in (watch_answer, list_answer):
        assert answer.status == 410
        assert json.loads(answer.data)["reason"] == "Expired"


def test_server_side_apply_twice_changes_nothing(cluster: SimCluster, apps: client.AppsV1Api) -> None:
    server_side_apply(apps, DAEMONSET)
    # The controller writes status as pods start; wait for that so only the second apply could change the object.
    assert cluster.wait_for(
        lambda: (
            apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system").status.number_ready == 3
        )
    )
    cluster.settle()
    first = apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system")
    second = server_side_apply(apps, DAEMONSET)
    assert second.metadata.resource_version == first.metadata.resource_version
    assert second.metadata.generation == 1
    owners = {(m.manager, m.operation) for m in second.metadata.managed_fields}
    assert ("test", "Apply") in owners


def test_server_side_apply_conflicts_with_another_manager_unless_forced(apps: client.AppsV1Api) -> None:
    server_side_apply(apps, DAEMONSET, manager="first")
    changed = daemonset()
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.local/k8s-device-plugin:v0.20.0"
    with pytest.raises(ApiException) as caught:
        server_side_apply(apps, changed, manager="second")
    assert caught.value.status == 409
    body = _status(caught.value)
    assert "conflict" in body["message"] and 'name="nvidia-device-plugin-ctr"' in body["message"]
    assert body["details"]["causes"][0]["reason"] == "FieldManagerConflict"

    forced = server_side_apply(apps, changed, manager="second", force=True)
    assert forced.spec.template.spec.containers[0].image == "registry.local/k8s-device-plugin:v0.20.0"
    assert forced.metadata.generation == 2


def test_server_side_apply_removes_fields_the_manager_dropped(apps: client.AppsV1Api) -> None:
    with_label = daemonset()
    with_label["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "kubegpu"}
    server_side_apply(apps, with_label)
    without = server_side_apply(apps, DAEMONSET)
    assert not (without.metadata.labels or {})


def test_dry_run_changes_nothing(core: client.CoreV1Api, apps: client.AppsV1Api) -> None:
    planned = core.create_namespaced_config_map("default", _configmap("dry"), dry_run="All")
    assert planned.metadata.name == "dry"
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_config_map("dry", "default")
    assert caught.value.status == 404

    live = server_side_apply(apps, DAEMONSET)
    changed = daemonset(priorityClassName="system-cluster-critical")
    preview = server_side_apply(apps, changed, dry_run="All")
    assert preview.spec.template.spec.priority_class_name == "system-cluster-critical"
    after = apps.read_namespaced_daemon_set(live.metadata.name, "kube-system")
    assert after.metadata.generation == 1
    assert after.spec.template.spec.priority_class_name == "system-node-critical"

    apps.delete_namespaced_daemon_set(live.metadata.name, "kube-system", dry_run="All")
    assert apps.read_namespaced_daemon_set(live.metadata.name, "kube-system").metadata.uid == live.metadata.uid


def test_error_statuses(cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api, tmp_path: Any) -> None:
    with pytest.raises(ApiException) as missing:
        core.read_node("no-such-node")
    assert missing.value.status == 404
    assert _status(missing.value)["message"] == 'nodes "no-such-node" not found'

    core.create_namespaced_config_map("default", _configmap("twice"))
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_config_map("default", _configmap("twice"))
    assert (exists.value.status, _status(exists.value)["reason"]) == (409, "AlreadyExists")

    with pytest.raises(ApiException) as bad_name:
        core.create_namespaced_config_map("default", _configmap("Not_Valid"))
    assert bad_name.value.status == 422
    assert _status(bad_name.value)["details"]["causes"][0]["field"] == "metadata.name"

    mismatched = daemonset()
    mismatched["spec"]["selector"] = {"matchLabels": {"name": "something-else"}}
    with pytest.raises(ApiException) as bad_selector:
        server_side_apply(apps, mismatched)
    assert bad_selector.value.status == 422
    assert "`selector` does not match template `labels`" in _status(bad_selector.value)["message"]

    wrong_token = config.new_client_from_config_dict(_with_token(cluster, "wrong-token"))
    with pytest.raises(ApiException) as unauthorized:
        client.CoreV1Api(wrong_token).list_node()
    assert unauthorized.value.status == 401
    assert _status(unauthorized.value)["kind"] == "Status"

    forbidden = config.new_client_from_config_dict(_with_token(cluster, "forbidden-token"))
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(forbidden).list_node()
    assert refused.value.status == 403
    assert 'cannot list resource "nodes"' in _status(refused.value)["message"]


def _with_token(cluster: SimCluster, token: str) -> dict[str, Any]:
    kubeconfig = cluster.kubeconfig_dict()
    kubeconfig["users"][0]["user"]["token"] = token
    return kubeconfig


def test_tls_is_verified_against_the_generated_ca(cluster: SimCluster) -> None:
    with SimCluster(tls=True) as other:
        wrong_ca = other.ca_file
        # The other simulator's CA did not sign this server's certificate: the handshake must fail.
        http = urllib3.PoolManager(ca_certs=wrong_ca, retries=False)
        with pytest.raises(urllib3.exceptions.SSLError):
            http.request("GET", f"{cluster.url}/version")
        right = urllib3.PoolManager(ca_certs=cluster.ca_file, retries=False)
        assert right.request("GET", f"{cluster.url}/version").status == 200
    context = ssl.create_default_context(cafile=cluster.ca_file)
    assert context.get_ca_certs()[0]["subject"]


def test_selectors_filter_lists(cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api) -> None:
    gpu_nodes = core.list_node(label_selector="nvidia.com/gpu.present=true")
    assert sorted(n.metadata.name for n in gpu_nodes.items) == ["gpu-1", "gpu-2"]
    assert [n.metadata.name for n in core.list_node(label_selector="!nvidia.com/gpu.present").items] == ["cpu-1"]
    assert [n.metadata.name for n in core.list_node(field_selector="metadata.name=gpu-2").items] == ["gpu-2"]
    server_side_apply(apps, DAEMONSET)
    assert cluster.wait_for(lambda: len(core.list_namespaced_pod("kube-system").items) == 3)
    on_gpu_1 = core.list_namespaced_pod("kube-system", field_selector="spec.nodeName=gpu-1")
    assert [p.spec.node_name for p in on_gpu_1.items] == ["gpu-1"]
    with pytest.raises(ApiException) as unsupported:
        core.list_namespaced_pod("kube-system", field_selector="spec.bogus=1")
    assert unsupported.value.status == 400


def test_list_pagination(core: client.CoreV1Api) -> None:
    for index in range(5):
        core.create_namespaced_config_map("default", _configmap(f"page-{index}"))
    first = core.list_namespaced_config_map("default", limit=2)
    assert len(first.items) == 2 and first.metadata._continue
    names = [c.metadata.name for c in first.items]
    token = first.metadata._continue
    while token:
        page = core.list_namespaced_config_map("default", limit=2, _continue=token)
        names += [c.metadata.name for c in page.items]
        token = page.metadata._continue
    assert names == [f"page-{i}" for i in range(5)]


def test_merge_and_strategic_patches(apps: client.AppsV1Api, core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", _configmap("patched", keep="1", drop="2"))
    merged = core.patch_namespaced_config_map(
        "patched", "default", {"data": {"drop": None, "new": "3"}}, _content_type="application/merge-patch+json"
    )
    assert merged.data == {"keep": "1", "new": "3"}

    server_side_apply(apps, DAEMONSET)
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "nvidia-device-plugin-ctr", "image": "x:1"}]}}}}
    patched = apps.patch_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system", patch)
    container = patched.spec.template.spec.containers[0]
    # Strategic merge: the container is merged by name, so its other fields survive.
    assert container.image == "x:1" and container.volume_mounts[0].name == "device-plugin"
    assert {m.manager for m in patched.metadata.managed_fields} >= {"test"}


def test_delete_propagates_to_daemonset_pods(
    cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    server_side_apply(apps, DAEMONSET)
    assert cluster.wait_for(lambda: len(core.list_namespaced_pod("kube-system").items) == 3)
    pod = core.list_namespaced_pod("kube-system").items[0]
    assert pod.metadata.owner_references[0].kind == "DaemonSet"
    assert pod.metadata.labels["name"] == "nvidia-device-plugin-ds"
    apps.delete_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system")
    assert cluster.wait_for(lambda: not core.list_namespaced_pod("kube-system").items)
    with pytest.raises(ApiException) as gone:
        apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system")
    assert gone.value.status == 404


def test_orphan_propagation_keeps_pods(cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api) -> None:
    server_side_apply(apps, DAEMONSET)
    assert cluster.wait_for(lambda: len(core.list_namespaced_pod("kube-system").items) == 3)
    apps.delete_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system", propagation_policy="Orphan")
    cluster.settle()
    pods = core.list_namespaced_pod("kube-system").items
    assert len(pods) == 3 and all(not p.metadata.owner_references for p in pods)


def test_pod_log_honours_tail_lines(cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api) -> None:
    server_side_apply(apps, DAEMONSET)
    assert cluster.wait_for(lambda: cluster.get_object("node", "gpu-1")["status"]["capacity"].get("nvidia.com/gpu"))
    pod = core.list_namespaced_pod("kube-system", field_selector="spec.nodeName=gpu-1").items[0]
    whole = core.read_namespaced_pod_log(pod.metadata.name, "kube-system")
    tail = core.read_namespaced_pod_log(pod.metadata.name, "kube-system", tail_lines=1)
    assert len(whole.splitlines()) > 3
    assert tail.splitlines() == whole.splitlines()[-1:]
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in tail

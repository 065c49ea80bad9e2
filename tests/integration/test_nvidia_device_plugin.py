"""kubegpu.node.nvidia_device_plugin against the simulated API server (tests/kubesim, a stand-in for kube-apiserver
and the kubelets; see tests/README.md), run in-process exactly as Ansible runs it."""

from __future__ import annotations

import threading

import pytest
from kubesim import SimCluster, SimNode
from kubesim.tlsutil import make_ca
from nvidia_device_plugin_harness import CONFIG_MAP, DAEMONSET, RUNTIME_CLASS, Api, auth_args, run_module

TIME_SLICING = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}


@pytest.fixture
def cluster():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2), SimNode("gpu-2", gpus=4)], capacity_delay=0.2) as sim:
        yield sim


def args(cluster, **extra):
    values = dict(auth_args(cluster), wait_timeout=10)
    values.update(extra)
    return values


def warnings_of(result):
    """Warning texts: ansible-core 2.19 returns each as a structured summary, older releases as a string."""
    texts = []
    for warning in result.get("warnings") or []:
        texts.append(warning if isinstance(warning, str) else str((warning.get("event") or {}).get("msg", warning)))
    return texts


def counts(cluster, verb, resource):
    return cluster.request_counts()["by_verb_resource"].get((verb, resource), 0)


# Apply, idempotence, check mode, diff ------------------------------------------------------------------------------


def test_apply_waits_for_capacity_and_second_run_is_unchanged(cluster):
    first = run_module(args(cluster, expected_gpus={"gpu-1": 2, "gpu-2": 4}))
    assert first.get("failed") is not True, first.get("msg")
    assert first["changed"] is True
    assert [(o["kind"], o["action"]) for o in first["objects"]] == [("DaemonSet", "created")]
    assert first["nodes"]["gpu-1"] == {
        "capacity": 2,
        "allocatable": 2,
        "expected": 2,
        "resource": "nvidia.com/gpu",
        "ready": True,
        "found": True,
        "node_ready": True,
    }
    assert first["nodes"]["gpu-2"]["capacity"] == 4
    assert first["daemonset"]["desiredNumberScheduled"] == 2
    assert 0 < first["waited"] < 10

    daemonset = Api(cluster).get(DAEMONSET)
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    managers = {entry["manager"] for entry in daemonset["metadata"]["managedFields"]}
    assert "kubegpu.node" in managers

    second = run_module(args(cluster, expected_gpus={"gpu-1": 2, "gpu-2": 4}))
    assert second["changed"] is False
    assert [o["action"] for o in second["objects"]] == ["unchanged"]


def test_check_mode_is_a_dry_run_that_does_not_wait(cluster):
    result = run_module(args(cluster, config=TIME_SLICING, runtime_class=True), check_mode=True)
    assert result["changed"] is True
    assert [o["action"] for o in result["objects"]] == ["created", "created", "created"]
    assert result["waited"] == 0
    assert result["nodes"] == {}
    api = Api(cluster)
    assert api.get(DAEMONSET) is None
    assert api.get(CONFIG_MAP) is None
    assert api.get(RUNTIME_CLASS) is None
    assert counts(cluster, "watch", "nodes") == 0
    assert counts(cluster, "list", "nodes") == 0


def test_check_mode_after_apply_reports_no_change(cluster):
    run_module(args(cluster, wait=False))
    result = run_module(args(cluster, wait=False), check_mode=True)
    assert result["changed"] is False


def test_diff_shows_what_changes(cluster):
    run_module(args(cluster, wait=False))
    result = run_module(args(cluster, wait=False, version="v0.18.2"), diff=True, check_mode=True)
    assert result["changed"] is True
    (entry,) = result["objects"]
    assert entry["action"] == "updated"
    assert "spec.template.spec.containers" in entry["changed_fields"]
    (diff,) = result["diff"]
    assert diff["before_header"] == "DaemonSet kube-system/nvidia-device-plugin-daemonset"
    before_image = diff["before"]["spec"]["template"]["spec"]["containers"][0]["image"]
    after_image = diff["after"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert (before_image, after_image) == (
        "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
        "nvcr.io/nvidia/k8s-device-plugin:v0.18.2",
    )
    assert "resourceVersion" not in diff["after"]["metadata"]
    assert "status" not in diff["after"]
    # Check mode changed nothing on the server.
    image = Api(cluster).get(DAEMONSET)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(":v0.20.0")


def test_image_options_registry_and_scheduling(cluster):
    result = run_module(
        args(
            cluster,
            registry="registry.example.internal/nvidia",
            version="v0.17.1",
            node_selector={"kubernetes.io/os": "linux"},
            tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            resources={"requests": {"cpu": "10m", "memory": "32Mi"}},
            image_pull_secrets=["pull-secret"],
            wait=False,
        )
    )
    assert result["changed"] is True
    pod = Api(cluster).get(DAEMONSET)["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.internal/nvidia/k8s-device-plugin:v0.17.1"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["imagePullSecrets"] == [{"name": "pull-secret"}]
    assert {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


# Config, RuntimeClass, time-slicing ---------------------------------------------------------------------------------


def test_time_slicing_capacity_is_gpus_times_replicas(cluster):
    result = run_module(args(cluster, config=TIME_SLICING, expected_gpus={"gpu-1": 2, "gpu-2": 4}))
    assert result.get("failed") is not True, result.get("msg")
    assert (result["nodes"]["gpu-1"]["capacity"], result["nodes"]["gpu-1"]["expected"]) == (8, 8)
    assert (result["nodes"]["gpu-2"]["capacity"], result["nodes"]["gpu-2"]["expected"]) == (16, 16)
    config_map = Api(cluster).get(CONFIG_MAP)
    assert '"replicas": 4' in config_map["data"]["config.yaml"]
    container = Api(cluster).get(DAEMONSET)["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "CONFIG_FILE", "value": "/etc/nvidia-device-plugin/config.yaml"} in container["env"]


def test_time_slicing_renamed_resource(cluster):
    config = {
        "version": "v1",
        "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
    }
    result = run_module(args(cluster, config=config, expected_gpus={"gpu-1": 2}))
    assert result.get("failed") is not True, result.get("msg")
    assert result["nodes"]["gpu-1"]["resource"] == "nvidia.com/gpu.shared"
    assert result["nodes"]["gpu-1"]["capacity"] == 4


def test_config_change_updates_config_map_and_rolls_pods(cluster):
    run_module(args(cluster, config=TIME_SLICING, wait=False))
    changed = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}
    result = run_module(args(cluster, config=changed, expected_gpus={"gpu-1": 2}))
    assert result.get("failed") is not True, result.get("msg")
    assert [o["action"] for o in result["objects"]] == ["updated", "updated"]
    assert result["nodes"]["gpu-1"]["capacity"] == 6


def test_runtime_class_is_created_and_used(cluster):
    result = run_module(args(cluster, runtime_class=True, expected_gpus={"gpu-1": 2}))
    assert result.get("failed") is not True, result.get("msg")
    actions = [(o["kind"], o["action"]) for o in result["objects"]]
    assert actions == [("RuntimeClass", "created"), ("DaemonSet", "created")]
    runtime_class = Api(cluster).get(RUNTIME_CLASS)
    assert runtime_class["handler"] == "nvidia"
    assert Api(cluster).get(DAEMONSET)["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"version": "v1", "flags": {"renameByDefault": True}}, "it belongs at sharing.timeSlicing.renameByDefault"),
        ({"version": "v2"}, "version: must be 'v1'"),
        ({"version": "v1", "flags": {"migStrategy": "auto"}}, "flags.migStrategy: must be one of none, single, mixed"),
        (
            {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}}},
            "replicas: must be at least 2",
        ),
        (
            {
                "version": "v1",
                "flags": {"migStrategy": "mixed"},
                "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
            },
            "MPS cannot be combined with MIG",
        ),
        (
            {
                "version": "v1",
                "sharing": {
                    "mps": {
                        "failRequestsGreaterThanOne": False,
                        "resources": [{"name": "nvidia.com/gpu", "replicas": 2}],
                    }
                },
            },
            "sharing.mps.failRequestsGreaterThanOne: false is ignored by the plugin",
        ),
    ],
)
def test_invalid_config_fails_before_any_api_call(cluster, config, fragment):
    cluster.reset_counts()
    result = run_module(args(cluster, config=config))
    assert result["failed"] is True
    assert fragment in result["msg"]
    assert any(fragment in problem for problem in result["config_errors"])
    assert cluster.request_counts()["total"] == 0


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"expected_gpus": {"gpu-1": -2}}, "GPU count must not be negative"),
        ({"wait_timeout": 0}, "wait_timeout: must be a positive number"),
        ({"api_key": None}, "host: needs credentials"),
        ({"runtime_class": "Not A Name"}, "not a valid RuntimeClass name"),
    ],
)
def test_bad_options_fail_before_any_api_call(cluster, extra, fragment):
    cluster.reset_counts()
    result = run_module(args(cluster, **extra))
    assert result["failed"] is True
    assert fragment in result["msg"]
    assert cluster.request_counts()["total"] == 0


def test_conflicting_options_are_refused(cluster, tmp_path):
    result = run_module(args(cluster, kubeconfig=cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))))
    assert result["failed"] is True
    assert "mutually exclusive" in result["msg"]
    result = run_module(args(cluster, image="example/dp:1", version="v0.20.0"))
    assert "mutually exclusive" in result["msg"]


# Authentication and TLS ------------------------------------------------------------------------------------------


def test_kubeconfig_file_and_dict(cluster, tmp_path):
    path = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
    by_file = run_module({"kubeconfig": path, "context": "kubesim", "nodes": ["gpu-1"], "wait_timeout": 10})
    assert by_file.get("failed") is not True, by_file.get("msg")
    by_dict = run_module({"kubeconfig": cluster.kubeconfig_dict(), "wait": False})
    assert by_dict.get("failed") is not True, by_dict.get("msg")
    assert by_dict["changed"] is False


def test_missing_kubeconfig_file(tmp_path):
    result = run_module({"kubeconfig": str(tmp_path / "nope")})
    assert result["failed"] is True
    assert "does not exist" in result["msg"]


def test_unauthorized_token(cluster):
    result = run_module(args(cluster, api_key="wrong-token"))
    assert result["failed"] is True
    assert result["status"] == 401
    assert "HTTP 401 Unauthorized" in result["msg"]
    assert "did not accept the credentials" in result["msg"]
    assert "Traceback" not in result.get("exception", "")


def test_forbidden_token(cluster):
    result = run_module(args(cluster, api_key="forbidden-token"))
    assert result["failed"] is True
    assert result["status"] == 403
    assert "HTTP 403 Forbidden" in result["msg"]
    assert "is forbidden" in result["msg"]
    assert "RBAC" in result["msg"]


def test_wrong_ca_fails_clearly(cluster, tmp_path):
    wrong, _key, _cert = make_ca(str(tmp_path))
    result = run_module(args(cluster, ca_cert=wrong))
    assert result["failed"] is True
    assert "TLS connection to https://127.0.0.1" in result["msg"]
    assert "certificate verify failed" in result["msg"]
    assert "set ca_cert" in result["msg"]


def test_validate_certs_false_warns(cluster):
    result = run_module(args(cluster, ca_cert=None, validate_certs=False, wait=False))
    assert result.get("failed") is not True, result.get("msg")
    assert any("TLS certificate verification" in warning for warning in warnings_of(result)), result.get("warnings")


def test_auth_options_come_from_k8s_auth_variables_as_in_kubernetes_core(cluster, monkeypatch):
    monkeypatch.setenv("K8S_AUTH_HOST", cluster.url)
    monkeypatch.setenv("K8S_AUTH_API_KEY", cluster.token)
    monkeypatch.setenv("K8S_AUTH_VERIFY_SSL", "false")
    result = run_module({"wait": False})
    assert result.get("failed") is not True, result.get("msg")
    assert any("TLS certificate verification" in warning for warning in warnings_of(result)), result.get("warnings")


def test_validate_certs_true_overrides_an_insecure_kubeconfig(cluster, tmp_path):
    kubeconfig = cluster.kubeconfig_dict()
    kubeconfig["clusters"][0]["cluster"].pop("certificate-authority-data")
    kubeconfig["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
    insecure = run_module({"kubeconfig": kubeconfig, "wait": False})
    assert insecure.get("failed") is not True, insecure.get("msg")
    assert any("TLS certificate verification" in warning for warning in warnings_of(insecure))
    verified = run_module({"kubeconfig": kubeconfig, "wait": False, "validate_certs": True})
    assert verified["failed"] is True
    assert "certificate verify failed" in verified["msg"]


def test_api_requests_are_returned_on_failure_too(cluster):
    cluster.fail_requests(count=1, status=429, retry_after=1)
    result = run_module(args(cluster, namespace="gpu-operators", wait=False))
    assert result["failed"] is True
    assert result["status"] == 404
    assert result["api_requests"] >= 2
    assert result["api_throttled"] == 1


def test_api_key_is_not_logged(cluster):
    result = run_module(args(cluster, wait=False))
    assert cluster.token not in str(result)


def test_inline_kubeconfig_credentials_are_not_logged(cluster):
    result = run_module({"kubeconfig": cluster.kubeconfig_dict(), "wait": False})
    assert result.get("failed") is not True, result.get("msg")
    assert "invocation" in result
    assert cluster.token not in str(result)


# API errors and retries ------------------------------------------------------------------------------------------


def test_transient_5xx_is_retried(cluster):
    cluster.fail_requests(count=2, status=503)
    result = run_module(args(cluster, nodes=["gpu-1"]))
    assert result.get("failed") is not True, result.get("msg")


def test_persistent_5xx_fails_with_status(cluster):
    cluster.fail_requests(count=50, status=503)
    result = run_module(args(cluster))
    assert result["failed"] is True
    assert result["status"] == 503
    assert "HTTP 503" in result["msg"]
    assert "server error" in result["msg"]


def test_invalid_object_fails_with_422(cluster):
    # A RuntimeClass "nvidia" that someone created with another handler: the handler is immutable.
    runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}}
    cluster.create_object(dict(runtime_class, handler="runc"))
    result = run_module(args(cluster, runtime_class=True, wait=False, force_conflicts=True))
    assert result["failed"] is True
    assert result["status"] == 422
    assert "HTTP 422" in result["msg"]
    assert "immutable" in result["msg"]
    assert "rejected the object as invalid" in result["msg"]


def test_missing_namespace_fails_with_404(cluster):
    result = run_module(args(cluster, namespace="gpu-operators", wait=False))
    assert result["failed"] is True
    assert result["status"] == 404
    assert "does not exist" in result["msg"]


def test_conflict_with_another_manager_and_force(cluster):
    run_module(args(cluster, wait=False))
    daemonset = Api(cluster).get(DAEMONSET)
    other = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": daemonset["metadata"]["name"], "namespace": "kube-system"},
        "spec": {
            "selector": daemonset["spec"]["selector"],
            "template": {
                "metadata": daemonset["spec"]["template"]["metadata"],
                "spec": {"containers": [{"name": "nvidia-device-plugin-ctr", "image": "example/other:1"}]},
            },
        },
    }
    import json

    import urllib3

    pool = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=cluster.ca_file)
    answer = pool.request(
        "PATCH",
        cluster.url + DAEMONSET + "?fieldManager=someone-else&force=true",
        body=json.dumps(other),
        headers={"Authorization": f"Bearer {cluster.token}", "Content-Type": "application/apply-patch+yaml"},
    )
    assert answer.status == 200, answer.data
    conflict = run_module(args(cluster, wait=False))
    assert conflict["failed"] is True
    assert conflict["status"] == 409
    assert "force_conflicts" in conflict["msg"]
    forced = run_module(args(cluster, wait=False, force_conflicts=True))
    assert forced.get("failed") is not True, forced.get("msg")
    assert forced["changed"] is True


# Watch robustness ------------------------------------------------------------------------------------------------


def test_dropped_watch_resumes_and_still_succeeds():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2), SimNode("gpu-2", gpus=2)], capacity_delay=0.6) as cluster:
        cluster.drop_watches(after_seconds=0.2)
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2, "gpu-2": 2}))
        assert result.get("failed") is not True, result.get("msg")
        # A broken stream is resumed from its last resourceVersion: no new list of every node.
        assert counts(cluster, "list", "nodes") == 1
        assert counts(cluster, "watch", "nodes") >= 2


def test_gone_relists_and_still_succeeds():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=0.8) as cluster:
        timer = threading.Timer(0.3, cluster.compact)
        timer.start()
        try:
            cluster.drop_watches(after_seconds=0.4, clean=True)
            result = run_module(args(cluster, expected_gpus={"gpu-1": 2}))
        finally:
            timer.cancel()
        assert result.get("failed") is not True, result.get("msg")
        assert counts(cluster, "list", "nodes") >= 2


@pytest.mark.parametrize("gone_as_http", [False, True])
def test_gone_on_first_watch_relists(gone_as_http):
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=0.5, gone_as_http=gone_as_http) as cluster:
        cluster.compact()
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2}))
        assert result.get("failed") is not True, result.get("msg")
        assert counts(cluster, "list", "nodes") >= 2


def test_api_traffic_does_not_grow_with_nodes():
    totals = {}
    for size in (3, 60):
        nodes = [SimNode(f"gpu-{i}", gpus=1) for i in range(size)]
        with SimCluster(nodes=nodes, capacity_delay=0.3, capacity_spread=0.5) as cluster:
            result = run_module(args(cluster))
            assert result.get("failed") is not True, result.get("msg")
            assert len(result["nodes"]) == size
            totals[size] = cluster.request_counts()["total"]
            assert counts(cluster, "list", "nodes") == 1
            assert counts(cluster, "watch", "nodes") == 1
            assert counts(cluster, "list", "pods") == 0
    assert totals[60] == totals[3]


# Diagnosis of each fault ----------------------------------------------------------------------------------------


def _fails_on(fault, fragment, **extra):
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2), SimNode("gpu-2", gpus=2)], capacity_delay=0.1) as cluster:
        cluster.set_fault("gpu-2", fault)
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2, "gpu-2": 2}, wait_timeout=2, **extra))
        assert result["failed"] is True
        assert result["msg"].startswith("timed out after 2s waiting for nvidia.com/gpu capacity: 1 of 2 nodes ready.")
        (message,) = result["diagnosis"]
        assert message.startswith("gpu-2: "), message
        assert fragment in message, message
        assert result["nodes"]["gpu-1"]["ready"] is True
        assert counts(cluster, "list", "pods") == 1
        return message, result


def test_diagnosis_nvml():
    message, _result = _fails_on("nvml", "the default runtime is not nvidia")
    assert "last log lines:" in message
    assert "No devices found. Waiting indefinitely." in message


def test_diagnosis_no_devices():
    _fails_on("no_devices", "found no GPU ('No devices found')")


def test_diagnosis_unhealthy():
    _message, result = _fails_on("unhealthy", "1 of 2 nvidia.com/gpu unhealthy (allocatable 1 < capacity 2)")
    assert result["nodes"]["gpu-2"]["allocatable"] == 1


def test_diagnosis_never_reports():
    _fails_on("never_reports", "is running but the node reports no nvidia.com/gpu yet")


def test_diagnosis_not_ready():
    _fails_on("not_ready", "node is not Ready")


def test_diagnosis_image_pull():
    _fails_on("image_pull", "image pull error")


def test_diagnosis_crash_loop():
    message, _result = _fails_on("crash_loop", "crash loop (CrashLoopBackOff")
    assert "nvml init failed" in message


def test_diagnosis_count_mismatch():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, expected_gpus={"gpu-1": 4}, wait_timeout=2))
    assert result["failed"] is True
    assert result["diagnosis"] == [
        "gpu-1: node reports 2 nvidia.com/gpu, expected 4 (a GPU missing from the node, a wrong expected_gpus count "
        "or a different time-slicing config)"
    ]


def test_diagnosis_missing_node(cluster):
    result = run_module(args(cluster, expected_gpus={"gpu-1": 2, "gpu-9": 1}, wait_timeout=2))
    assert result["failed"] is True
    assert result["diagnosis"] == ["gpu-9: node not found in the cluster (check the name in expected_gpus or nodes)"]


TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def test_diagnosis_taint_and_selector_mismatch():
    nodes = [
        SimNode("gpu-1", gpus=2, labels={"gpu": "yes"}),
        SimNode("gpu-2", gpus=2, labels={"gpu": "yes"}, taints=[TAINT]),
        SimNode("gpu-3", gpus=2),
    ]
    with SimCluster(nodes=nodes, capacity_delay=0.1) as cluster:
        result = run_module(
            args(
                cluster,
                node_selector={"gpu": "yes"},
                expected_gpus=dict.fromkeys(("gpu-1", "gpu-2", "gpu-3"), 2),
                wait_timeout=2,
            )
        )
    assert result["failed"] is True
    assert result["diagnosis"] == [
        "gpu-2: no device plugin pod on this node: taint not tolerated: dedicated=ml:NoSchedule (add a toleration)",
        "gpu-3: no device plugin pod on this node: node_selector does not match: needs gpu=yes "
        "(node has no such label)",
    ]


def test_no_matching_node_is_a_failure_not_a_pass():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, node_selector={"nvidia.com/gpu.present": "true"}, wait_timeout=1))
    assert result["failed"] is True
    assert "no node matches" in result["diagnosis"][0]


def test_node_without_gpus_expected_as_zero():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2), SimNode("cpu-1", gpus=0)], capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, expected_gpus={"gpu-1": 2, "cpu-1": 0}))
    assert result.get("failed") is not True, result.get("msg")
    assert result["nodes"]["cpu-1"]["capacity"] == 0


# state=absent ----------------------------------------------------------------------------------------------------


def test_absent_removes_what_was_created(cluster):
    run_module(args(cluster, config=TIME_SLICING, runtime_class=True, wait=False))
    preview = run_module(args(cluster, state="absent", runtime_class=True), check_mode=True, diff=True)
    assert preview["changed"] is True
    assert len(preview["diff"]) == 3
    assert Api(cluster).get(DAEMONSET) is not None
    removed = run_module(args(cluster, state="absent", runtime_class=True))
    assert removed["changed"] is True
    assert [o["action"] for o in removed["objects"]] == ["deleted", "deleted", "deleted"]
    api = Api(cluster)
    assert api.get(DAEMONSET) is None
    assert api.get(CONFIG_MAP) is None
    assert api.get(RUNTIME_CLASS) is None
    again = run_module(args(cluster, state="absent", runtime_class=True))
    assert again["changed"] is False
    assert [o["action"] for o in again["objects"]] == ["absent", "absent", "absent"]


def test_absent_keeps_objects_it_did_not_create(cluster):
    cluster.create_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "nvidia-device-plugin-config", "namespace": "kube-system"},
        }
    )
    result = run_module(args(cluster, state="absent"))
    assert result["changed"] is False
    assert [o["action"] for o in result["objects"]] == ["absent", "kept"]
    assert any("not created by kubegpu.node" in warning for warning in warnings_of(result))
    assert Api(cluster).get(CONFIG_MAP) is not None


def test_unreachable_api_server_fails_clearly():
    with SimCluster(nodes=[], capacity_delay=0.1) as cluster:
        url, token = cluster.url, cluster.token
    result = run_module({"host": url, "api_key": token, "validate_certs": False, "wait": False})
    assert result["failed"] is True
    assert result["msg"].startswith(f"cannot reach the API server at {url}")

"""kubegpu.node run as AWX runs a job: in the execution environment image, through ansible-runner.

AWX's control node writes a private data directory (project/, inventory/, env/extravars, env/envvars, env/ssh_key and
the credentials' files in env/), streams it with `ansible-runner transmit` to an execution node, where receptor starts
the execution environment with `ansible-runner worker`, and reads the events back with `ansible-runner process`.
These tests do the same with a pipe in place of receptor: the image built by tools/build-ee.sh, two podman
containers with sshd as the GPU nodes (reached over SSH with the job's key, as a machine credential does), and the
simulated API server (tests/kubesim) as the cluster, reached with the variables AWX's "OpenShift or Kubernetes API
Bearer Token" credential injects. The worker container uses the host's network: the simulated API server listens on
127.0.0.1 only, and the nodes' addresses on podman's bridge are routed from the host.

Slow (an image build when its inputs changed, containers, three jobs): run with `make awx`, which sets
KUBEGPU_AWX_TEST=1. Skipped in `make unit`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubesim import SimCluster, SimNode

REPO = Path(__file__).resolve().parents[2]
NODE_IMAGE = os.environ.get("AWX_TEST_NODE_IMAGE", "kubegpu-node-test:bookworm")
NODES = {"kubegpu-awx-node-1": 8, "kubegpu-awx-node-2": 4}
DEVICE_PLUGIN_TASK = "Apply the device plugin and wait for nvidia.com/gpu capacity"
PREFLIGHT_NODES_TASK = "Read the cluster's nodes (one list for the whole play)"
JOB_TIMEOUT = 900

pytestmark = pytest.mark.skipif(
    os.environ.get("KUBEGPU_AWX_TEST") != "1",
    reason="builds an execution environment and starts podman nodes: run with `make awx`",
)


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)


def _remove_nodes() -> None:
    _run(["podman", "rm", "-f", *NODES])


# ----- the execution environment, the nodes and the cluster -------------------------------------------------------


@pytest.fixture(scope="module")
def ee_image() -> str:
    built = _run([str(REPO / "tools" / "build-ee.sh")], timeout=1800)
    assert built.returncode == 0, built.stderr
    print(built.stderr.strip())
    return built.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def ssh_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    key = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    made = _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kubegpu-awx-test", "-f", str(key)])
    assert made.returncode == 0, made.stderr
    return key


@pytest.fixture(scope="module")
def nodes(ssh_key: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The GPU nodes' addresses on podman's network, by name."""
    _remove_nodes()
    try:
        for name in NODES:
            started = _run(["podman", "run", "-d", "--name", name, "--hostname", name, "--systemd=always", NODE_IMAGE])
            assert started.returncode == 0, started.stderr
        inventory = tmp_path_factory.mktemp("prepare") / "inventory.yml"
        inventory.write_text(
            yaml.safe_dump(
                {
                    "gpu_nodes": {
                        # demo/prepare.yml writes each node's nvidia-smi stand-in and driver facts for its GPUs.
                        "hosts": {name: {"kubegpu_gpu_count": gpus} for name, gpus in NODES.items()},
                        "vars": {
                            "ansible_connection": "containers.podman.podman",
                            "ansible_python_interpreter": "/usr/bin/python3",
                        },
                    }
                }
            )
        )
        prepared = _run(
            [
                "ansible-playbook",
                str(REPO / "tests" / "awx" / "prepare-nodes.yml"),
                "-i",
                str(inventory),
                "-e",
                f"awx_test_public_key='{ssh_key.with_suffix('.pub').read_text().strip()}'",
            ],
            timeout=900,
        )
        assert prepared.returncode == 0, prepared.stdout + prepared.stderr
        addresses = {}
        for name in NODES:
            inspected = _run(["podman", "inspect", "--format", "{{.NetworkSettings.IPAddress}}", name])
            assert inspected.returncode == 0 and inspected.stdout.strip(), inspected.stderr
            addresses[name] = inspected.stdout.strip()
        yield addresses
    finally:
        _remove_nodes()


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    with SimCluster(nodes=[SimNode(name, gpus=gpus) for name, gpus in NODES.items()], capacity_delay=0.5) as sim:
        yield sim


# ----- a job, as AWX lays it out and streams it ---------------------------------------------------------------------


def _copy_project(source: Path, target: Path, files: list[str] | None = None) -> None:
    """What a project sync leaves: the repository's files, links kept as links."""
    if files is None:
        listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=source)
        assert listed.returncode == 0, listed.stderr
        files = [f for f in listed.stdout.split("\0") if f]
    for name in files:
        src = source / name
        if not src.exists() and not src.is_symlink():
            continue
        dest = target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dest.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dest)


def _write_job(
    pdd: Path,
    project: Path,
    nodes: dict[str, str],
    ssh_key: Path,
    envvars: dict[str, str],
    env_files: dict[str, str],
) -> None:
    _copy_project(project, pdd / "project")
    (pdd / "inventory").mkdir(parents=True)
    hosts = {name: {"ansible_host": address, "kubegpu_gpu_count": NODES[name]} for name, address in nodes.items()}
    inventory = {
        "all": {
            "children": {
                "gpu_nodes": {
                    "hosts": hosts,
                    "vars": {
                        "ansible_user": "root",
                        "ansible_python_interpreter": "/usr/bin/python3",
                        "container_runtime_engines": ["containerd"],
                    },
                }
            }
        }
    }
    (pdd / "inventory" / "hosts.yml").write_text(yaml.safe_dump(inventory))
    env = pdd / "env"
    env.mkdir()
    extravars = {
        "kubegpu_serial": 1,
        "kubegpu_device_plugin_wait_timeout": 60,
        "kubegpu_validation_timeout": 60,
        # As in the demo: runc cannot start a container inside these podman nodes (nested cgroups), so the
        # in-container nvidia-smi check is off; the per-node pod check on the simulated kubelet stands in for it.
        "kubegpu_validate_container": False,
        # The job proves how AWX runs site.yml (execution environment, credentials, SSH, the API): the driver, toolkit
        # and kubelet steps, which need the stand-in package repositories and kubelet of the demo and of their molecule
        # scenarios, are off; the nodes get the older stand-ins instead (demo/prepare.yml with demo_chain false).
        "kubegpu_nvidia_driver": False,
        "kubegpu_nvidia_container_toolkit": False,
        "kubegpu_kubelet": False,
    }
    (env / "extravars").write_text(yaml.safe_dump(extravars))
    (env / "envvars").write_text(yaml.safe_dump({"ANSIBLE_HOST_KEY_CHECKING": "False", **envvars}))
    (env / "ssh_key").write_text(ssh_key.read_text())
    (env / "ssh_key").chmod(0o600)
    for name, content in env_files.items():
        (env / name).write_text(content)
        (env / name).chmod(0o600)


class Job:
    def __init__(self, pdd: Path) -> None:
        self.pdd = pdd
        # `ansible-runner process` writes the streamed artifacts straight into artifacts/.
        self.artifacts = pdd / "artifacts"
        self.status = (self.artifacts / "status").read_text().strip()
        self.rc = int((self.artifacts / "rc").read_text().strip())
        self.events = sorted(
            (json.loads(p.read_text()) for p in (self.artifacts / "job_events").glob("*.json")),
            key=lambda e: e["counter"],
        )
        self.output = (self.artifacts / "stdout").read_text() if (self.artifacts / "stdout").exists() else ""

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]

    @property
    def stats(self) -> dict[str, Any]:
        (stats,) = self.of("playbook_on_stats")
        return stats["event_data"]


def _run_job(pdd: Path, playbook: str, image: str, name: str) -> Job:
    """ansible-runner transmit | the execution environment running `ansible-runner worker` | ansible-runner process."""
    log = pdd.parent / f"{name}.log"
    with open(log, "w") as out:
        transmit = subprocess.Popen(["ansible-runner", "transmit", str(pdd), "-p", playbook], stdout=subprocess.PIPE)
        # The image's own user (uid 1000), as on an AWX execution node.
        worker_command = ["ansible-runner", "worker", "--private-data-dir", "/runner"]
        worker = subprocess.Popen(
            ["podman", "run", "--rm", "-i", "--network", "host", image, *worker_command],
            stdin=transmit.stdout,
            stdout=subprocess.PIPE,
            stderr=out,
        )
        assert transmit.stdout is not None and worker.stdout is not None
        transmit.stdout.close()
        process = subprocess.Popen(
            ["ansible-runner", "process", str(pdd)], stdin=worker.stdout, stdout=out, stderr=subprocess.STDOUT
        )
        worker.stdout.close()
        process.wait(timeout=JOB_TIMEOUT)
        worker.wait(timeout=60)
        transmit.wait(timeout=60)
    assert (pdd / "artifacts" / "status").exists(), log.read_text()
    return Job(pdd)


def _bearer_token_credential(cluster: SimCluster, token: str) -> tuple[dict[str, str], dict[str, str]]:
    """The variables and file AWX's "OpenShift or Kubernetes API Bearer Token" credential injects (verify on)."""
    assert cluster.ca_file
    envvars = {
        "K8S_AUTH_HOST": cluster.url,
        "K8S_AUTH_API_KEY": token,
        "K8S_AUTH_VERIFY_SSL": "True",
        "K8S_AUTH_SSL_CA_CERT": "/runner/env/kube-ca.crt",
    }
    return envvars, {"kube-ca.crt": Path(cluster.ca_file).read_text()}


@pytest.fixture(scope="module")
def first_job(ee_image, nodes, ssh_key, cluster, tmp_path_factory) -> Job:
    envvars, files = _bearer_token_credential(cluster, "test-token")
    pdd = tmp_path_factory.mktemp("job1") / "pdd"
    _write_job(pdd, REPO / "examples" / "awx", nodes, ssh_key, envvars, files)
    return _run_job(pdd, "site.yml", ee_image, "1")


@pytest.fixture(scope="module")
def second_job(first_job, ee_image, nodes, ssh_key, cluster, tmp_path_factory) -> Job:
    envvars, files = _bearer_token_credential(cluster, "test-token")
    pdd = tmp_path_factory.mktemp("job2") / "pdd"
    _write_job(pdd, REPO / "examples" / "awx", nodes, ssh_key, envvars, files)
    return _run_job(pdd, "site.yml", ee_image, "2")


def _role_task_paths(job: Job) -> set[str]:
    return {
        e["event_data"]["task_path"].rsplit("/roles/", 1)[0]
        for e in job.of("runner_on_ok")
        if "/roles/container_runtime/" in e["event_data"].get("task_path", "")
    }


# ----- the tests ----------------------------------------------------------------------------------------------------


def test_the_example_project_configures_the_nodes_and_the_cluster(first_job, nodes, cluster):
    job = first_job
    assert (job.status, job.rc) == ("successful", 0), job.output
    stats = job.stats
    assert not stats.get("failures") and not stats.get("dark"), stats
    for name in NODES:
        assert stats["changed"].get(name, 0) > 0, stats
    # The roles came from the collection inside the image: the example project has none of its own.
    assert _role_task_paths(job) == {"/usr/share/ansible/collections/ansible_collections/kubegpu/node"}
    (applied,) = [e for e in job.of("runner_on_ok") if e["event_data"]["task"] == DEVICE_PLUGIN_TASK]
    assert applied["event_data"]["res"]["changed"] is True
    daemonset = cluster.get_object("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system")
    assert daemonset is not None
    for name, gpus in NODES.items():
        assert cluster.get_object("Node", name)["status"]["capacity"]["nvidia.com/gpu"] == str(gpus)
        dump = _run(["podman", "exec", name, "containerd", "config", "dump"])
        assert dump.returncode == 0, dump.stderr
        assert 'default_runtime_name = "nvidia"' in dump.stdout


def test_a_second_job_changes_nothing(second_job):
    job = second_job
    assert (job.status, job.rc) == ("successful", 0), job.output
    stats = job.stats
    assert set(stats["ok"]) >= set(NODES), stats
    assert not stats.get("changed"), f"the second job changed something: {stats['changed']}"
    changed = [e["event_data"]["task"] for e in job.of("runner_on_ok") if e["event_data"]["res"].get("changed")]
    assert changed == []


def test_a_bad_kubeconfig_fails_the_job_before_any_change(
    second_job, ee_image, nodes, ssh_key, cluster, tmp_path_factory
):
    # The project is this repository, as when an AWX project points at it: ansible.cfg finds the collection in it.
    kubeconfig = cluster.kubeconfig_dict()
    kubeconfig["users"][0]["user"]["token"] = "expired-token"
    pdd = tmp_path_factory.mktemp("job3") / "pdd"
    # A custom credential type injecting a kubeconfig file, as AWX users do for clusters without a bearer token type.
    _write_job(
        pdd,
        REPO,
        nodes,
        ssh_key,
        {"K8S_AUTH_KUBECONFIG": "/runner/env/kubeconfig"},
        {"kubeconfig": yaml.safe_dump(kubeconfig)},
    )
    job = _run_job(pdd, "playbooks/site.yml", ee_image, "3")
    assert job.status == "failed" and job.rc != 0, job.output
    # Found through ansible.cfg and the link in collections/, before the image's own copy.
    assert _role_task_paths(job) == {"/runner/project/collections/ansible_collections/kubegpu/node"}
    # site.yml's preflight reads the cluster's nodes (kubernetes.core.k8s_info) before any host changes: the refused
    # credentials stop the job there, with the API server's answer, and no node was touched.
    failed = job.of("runner_on_failed")
    assert [e["event_data"]["task"] for e in failed] == [PREFLIGHT_NODES_TASK], job.output
    message = failed[0]["event_data"]["res"]["msg"]
    assert "401" in message and "Unauthorized" in message, message
    assert not job.of("runner_on_ok") or all(not e["event_data"]["res"].get("changed") for e in job.of("runner_on_ok"))
    assert "expired-token" not in json.dumps(job.events)

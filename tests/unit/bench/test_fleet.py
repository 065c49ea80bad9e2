"""bench/fleet.py's pure parts: the SSH round trips read from a -vvv log, a clone's marks read from a converged Node's
managedFields, the run summaries and the 1,000-node projection built from them."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("bench_fleet", REPO / "bench" / "fleet.py")
fleet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fleet)

# What ansible-playbook -vvv prints for the ssh connection (ansible-core 2.19), trimmed: two hosts, a pipelined module
# each (one ssh), an sftp put on one, a delegated task on the controller (no ssh), and a second play.
VVV_LOG = """\
PLAY [Preflight every GPU node before any of them changes] *********************

TASK [kubegpu.node.nvidia_driver : Plan the driver from the node as it is] *****
<10.0.0.1> ESTABLISH SSH CONNECTION FOR USER: root
<10.0.0.1> SSH: EXEC ssh -C -o ControlMaster=auto -o ControlPersist=60s 10.0.0.1 '/bin/sh -c '"'"'python3'"'"''
<10.0.0.2> SSH: EXEC ssh -C -o ControlMaster=auto 10.0.0.2 '/bin/sh -c '"'"'python3'"'"''
<10.0.0.2> SSH: EXEC sftp -b - -C -o ControlMaster=auto '[10.0.0.2]'
<10.0.0.2> SSH: EXEC ssh -C -o ControlMaster=auto 10.0.0.2 '/bin/sh -c '"'"'rm -f -r /tmp/x'"'"''
ok: [kubegpu-bench-node-01]

TASK [Read the cluster's nodes (one list for the whole play)] ******************
ok: [kubegpu-bench-node-01 -> localhost]

PLAY [Make GPU nodes ready, a batch at a time] *********************************

TASK [GPU labels : Apply] ******************************************************
<10.0.0.1> SSH: EXEC ssh -C -o ControlMaster=auto 10.0.0.1 '/bin/sh -c '"'"'python3'"'"''
<10.0.0.1> SSH: EXEC ssh -C -o ControlMaster=auto 10.0.0.1 '/bin/sh -c '"'"'python3'"'"''
"""


def test_count_log_counts_each_ssh_and_sftp_command_by_play_role_and_task(tmp_path):
    log = tmp_path / "vvv.log"
    log.write_text(VVV_LOG)
    counts = fleet.count_log(log)
    plan = counts[
        ("preflight play", "nvidia_driver", "kubegpu.node.nvidia_driver : Plan the driver from the node as it is")
    ]
    # Each ssh and sftp command is one round trip.
    assert dict(plan) == {"10.0.0.1": 1, "10.0.0.2": 3}
    assert dict(counts[("batch play", "GPU labels", "GPU labels : Apply")]) == {"10.0.0.1": 2}
    # The delegated task made no SSH command: it has no row.
    assert not [k for k in counts if "Read the cluster" in k[2]]


def test_roundtrips_report_totals_per_host_under_its_inventory_name(tmp_path):
    log = tmp_path / "vvv.log"
    log.write_text(VVV_LOG)
    report = fleet.roundtrips_report(log, {"10.0.0.1": "node-01", "10.0.0.2": "node-02"})
    header = report.splitlines()[0]
    assert header == "| play | role or file | node-01 | node-02 |"
    total = next(line for line in report.splitlines() if line.startswith("| all |"))
    assert total == "| all |  | 3 | 3 |"


def test_count_log_reads_ssh_exec_lines_with_or_without_a_port():
    assert fleet._EXEC.match("<10.0.0.1> SSH: EXEC ssh -C 10.0.0.1").group(1, 2) == ("10.0.0.1", "ssh")
    assert fleet._EXEC.match("<node.example> SSH: EXEC scp -C x y").group(1, 2) == ("node.example", "scp")
    assert fleet._EXEC.match("<10.0.0.1> SSH: EXEC sshpass -d10 ssh") is None


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("Preflight every GPU node before any of them changes", "preflight play"),
        ("Make GPU nodes ready, a batch at a time", "batch play"),
        ("Deploy NVIDIA's device plugin, wait until every node reports its GPUs, and prove they work", "cluster play"),
        ("Something else", "Something else"),
    ],
)
def test_play_label_names_site_yml_plays(name, label):
    assert fleet.play_label(name) == label


def test_play_labels_match_the_plays_of_site_yml():
    plays = yaml.safe_load((REPO / "playbooks" / "site.yml").read_text())
    labels = {fleet.play_label(p["name"]) for p in plays if "name" in p}
    assert labels == {"preflight play", "batch play", "cluster play"}


def test_task_group_is_the_role_or_site_yml():
    assert fleet.task_group("kubegpu.node.kubelet : Plan the gates") == "kubelet"
    assert fleet.task_group("Read the cluster's nodes (one list for the whole play)") == "site.yml"


def _managed(manager: str, fields: dict, operation: str = "Apply", subresource: str | None = None) -> dict:
    entry = {"manager": manager, "operation": operation, "apiVersion": "v1", "fieldsType": "FieldsV1"}
    entry["fieldsV1"] = {"f:metadata": fields}
    if subresource:
        entry["subresource"] = subresource
    return entry


GOLDEN = {
    "metadata": {
        "name": "kubegpu-bench-golden",
        "labels": {
            "kubernetes.io/hostname": "kubegpu-bench-golden",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": "4",
            "team": "ml",
        },
        "annotations": {"kubegpu.node/validated": '{"driver": "580.95.05"}', "other/thing": "x"},
        "managedFields": [
            _managed(
                "kubegpu.node-gpu-labels", {"f:labels": {"f:nvidia.com/gpu.product": {}, "f:nvidia.com/gpu.count": {}}}
            ),
            _managed("kubegpu.node-validation", {"f:annotations": {"f:kubegpu.node/validated": {}}}),
            # Another manager's labels, an Update (kubectl label) and a status write are not this collection's marks.
            _managed("kubectl", {"f:labels": {"f:team": {}}}),
            _managed("kubegpu.node-x", {"f:labels": {"f:team": {}}}, operation="Update"),
            _managed("kubegpu.node-status", {"f:labels": {"f:team": {}}}, subresource="status"),
            # A field this manager owned that is gone from the node: nothing to copy.
            _managed("kubegpu.node-gpu-health", {"f:labels": {"f:kubegpu.node/gpu-health": {}}}),
        ],
    }
}


def test_node_marks_copies_each_managers_applied_labels_and_annotations_to_the_clone():
    marks = fleet.node_marks(GOLDEN, "kubegpu-bench-node-01")
    assert marks == [
        (
            "kubegpu.node-gpu-labels",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": "kubegpu-bench-node-01",
                    "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "4"},
                },
            },
        ),
        (
            "kubegpu.node-validation",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": "kubegpu-bench-node-01",
                    "annotations": {"kubegpu.node/validated": '{"driver": "580.95.05"}'},
                },
            },
        ),
    ]


def test_node_marks_of_a_node_without_managed_fields_is_empty():
    assert fleet.node_marks({"metadata": {"name": "n"}}, "m") == []


def _task(host, play, task, status="ok", ssh=1, cpu=0.01, children=0.09, wall=0.5, delegated=False, run_once=False):
    return {
        "play": play,
        "task": task,
        "action": "ansible.builtin.command",
        "host": host,
        "delegated": delegated,
        "run_once": run_once,
        "status": status,
        "ssh": ssh,
        "cpu": cpu,
        "cpu_children": children,
        "wall": wall,
    }


def _write_run(
    path: Path, hosts: int, cpu_main: float, cpu_children: float, wall: float = 0.5, load: float = 1.5
) -> Path:
    path.mkdir(parents=True)
    tasks = []
    for i in range(hosts):
        h = f"node-{i:02d}"
        tasks += [
            _task(h, "preflight play", "kubegpu.node.nvidia_driver : Plan", ssh=2, wall=wall),
            _task(h, "batch play", "kubegpu.node.kubelet : Read", ssh=1, wall=wall),
            _task(h, "batch play", "kubegpu.node.kubelet : Skip", status="skipped", ssh=0, wall=0.01),
            _task(h, "batch play", "GPU labels", ssh=0, delegated=True, wall=0.7),
        ]
    tasks.append(_task("node-00", "cluster play", "Apply the device plugin", ssh=0, delegated=True, run_once=True))
    (path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    main_per_task = [
        {"play": "preflight play", "task": "Read the cluster's nodes", "wall": 1.5, "cpu": 0.1, "run_once": True},
        {"play": "batch play", "task": "Stop the roll-out", "wall": 0.2, "cpu": 0.01, "run_once": True},
        {"play": "cluster play", "task": "Apply the device plugin", "wall": 2.5, "cpu": 0.3, "run_once": True},
        {"play": "cluster play", "task": "kubegpu.node.kubelet : Read", "wall": 0.5, "cpu": 0.05, "run_once": False},
    ]
    summary = {
        "args": ["-i", "inv", "kubegpu.node.site", "--forks", str(hosts)],
        "exit_code": 0,
        "wall_s": 30.0,
        "cpu_main_s": cpu_main,
        "cpu_children_s": cpu_children,
        "load": {"load1_mean": load, "load1_max": 2.0, "machine_busy_mean": 0.5, "cpus": 2},
        "main_per_task": main_per_task,
        "when": "2026-11-25 23:00 UTC",
    }
    (path / "run.json").write_text(json.dumps(summary))
    return path


def test_summarise_run_gives_per_host_figures(tmp_path):
    run = fleet.summarise_run(_write_run(tmp_path / "n02-r1", hosts=2, cpu_main=3.0, cpu_children=6.0))
    assert run["n"] == 2
    assert run["forks"] == "2"
    assert run["cpu_per_host_s"] == 4.5
    # 4 host-tasks per host, and the run_once task once for the whole run.
    assert run["host_tasks_per_host"] == 4.5
    assert run["main_per_host_task_ms"] == pytest.approx(3000 / 9)
    assert run["worker_per_host_task_ms"] == pytest.approx(6000 / 9)
    assert (run["ssh_min"], run["ssh_max"]) == (3, 3)
    assert run["tasks_per_play"] == pytest.approx({"preflight play": 1, "batch play": 3, "cluster play": 0.5})
    # The run_once steps outside the batch play: once per run, whatever the number of hosts.
    assert run["cluster_steps_s"] == pytest.approx(4.0)
    # Latency: the mean wall time of the tasks that ran on a node (not skipped, not delegated).
    assert run["latency_per_task_s"] == pytest.approx(0.5)


def test_per_host_counts_round_trips_and_cpu_of_each_host():
    tasks = [_task("a", "p", "t", ssh=3, cpu=0.1, children=0.2), _task("a", "p", "u", status="skipped", ssh=0)]
    tasks.append(_task("b", "p", "t", ssh=5))
    per = fleet.per_host(tasks)
    assert per["a"]["ssh"] == 3
    assert per["a"]["host_tasks"] == 2
    assert per["a"]["skipped"] == 1
    assert per["a"]["cpu"] == pytest.approx(0.3 + 0.1)
    assert per["b"]["ssh"] == 5


def test_projected_seconds_takes_the_longest_bound_of_each_play():
    model = {
        "main_ms": 10.0,
        "work_ms": 90.0,
        "latency_s": 0.5,
        "tasks_per_play": {"preflight play": 40, "batch play": 100, "cluster play": 10},
        "cluster_s": 60.0,
    }
    total, parts = fleet.projected_seconds(model, hosts=1000, forks=50, serial_pct=25, cores=8)
    # preflight: 1,000 hosts in 20 waves: latency 40 x 20 x 0.5 = 400 s; main 40,000 x 10 ms = 400 s;
    # CPU 40,000 x 100 ms / 8 = 500 s.
    # batch: 4 batches of 250 (5 waves): latency 100 x 5 x 0.5 = 250 s; main 25,000 x 10 ms = 250 s;
    # CPU 25,000 x 100 ms / 8 = 312.5 s, each batch.
    # cluster: latency 10 x 20 x 0.5 = 100 s; main 100 s; CPU 125 s.
    assert total == pytest.approx(60 + 500 + 4 * 312.5 + 125)
    assert parts[1] == "batch play: 4 x max(250, 250, 312) s"
    # More cores: the latency and the main process bound it.
    total16, _parts = fleet.projected_seconds(model, hosts=1000, forks=50, serial_pct=25, cores=16)
    assert total16 == pytest.approx(60 + 400 + 4 * 250 + 100)


def test_projected_seconds_with_few_hosts_keeps_one_host_a_batch():
    model = {"main_ms": 1.0, "work_ms": 1.0, "latency_s": 1.0, "tasks_per_play": {"batch play": 10}, "cluster_s": 0}
    total, _parts = fleet.projected_seconds(model, hosts=2, forks=2, serial_pct=25, cores=2)
    # 25% of 2 hosts rounds down to none: one host a batch, two batches of 10 tasks of 1 s.
    assert total == pytest.approx(20)


def test_fit_line_is_least_squares():
    a, b = fleet.fit_line([2, 8, 16], [12.0, 24.0, 40.0])
    assert (a, b) == pytest.approx((8.0, 2.0))
    assert fleet.fit_line([4], [5.0]) == (5.0, 0.0)


def test_cost_model_follows_a_growing_cost():
    assert fleet.cost_model([2, 8, 16], [12.0, 24.0, 40.0]) == pytest.approx((8.0, 2.0))


def test_cost_model_holds_a_falling_cost_at_the_largest_size():
    # bench/RESULTS.md, 2026-11-26: 9.2 ms per host-task at 2 hosts, 8.3 at 8. The line through them is 9.5 - 0.15 x
    # hosts: negative from about 63 hosts on, so a 1,000-node projection came out as the latency bound alone.
    a, b = fleet.cost_model([2, 8], [9.2, 8.3])
    assert (a, b) == (8.3, 0.0)
    assert a + b * 1000 == pytest.approx(8.3)
    assert fleet.cost_model([16, 2, 8], [8.0, 9.2, 8.3]) == (8.0, 0.0)
    assert fleet.cost_model([4], [5.0]) == (5.0, 0.0)


def test_projection_of_a_falling_cost_is_the_main_process_bound(tmp_path):
    # The cost per host-task falls from 2 to 8 hosts; 1,000 hosts must still cost the main process 8 hosts' figure
    # for every host-task, not the latency bound alone.
    small = _write_run(tmp_path / "n02-r1", hosts=2, cpu_main=3.0, cpu_children=6.0)
    big = _write_run(tmp_path / "n08-r1", hosts=8, cpu_main=8.0, cpu_children=16.0)
    runs = [fleet.summarise_run(small), fleet.summarise_run(big)]
    assert runs[0]["main_per_host_task_ms"] > runs[1]["main_per_host_task_ms"]
    out = fleet.report([small, big], hosts=1000, forks=50, serial_pct=25, cores=[16])
    per_task_ms = runs[1]["main_per_host_task_ms"]
    host_tasks = 1000 * runs[1]["host_tasks_per_host"]
    minutes = float(next(line for line in out.splitlines() if line.startswith("| 16 |")).split("|")[2])
    assert minutes >= host_tasks * per_task_ms / 1000 / 60 - 0.1
    assert f"({per_task_ms:.1f} ms at 1000)" in out


def test_report_has_a_row_per_run_and_projects_from_two_sizes(tmp_path):
    small = _write_run(tmp_path / "n02-r1", hosts=2, cpu_main=3.0, cpu_children=6.0)
    big = _write_run(tmp_path / "n08-r1", hosts=8, cpu_main=14.0, cpu_children=24.0)
    out = fleet.report([small, big], hosts=1000, forks=50, serial_pct=25, cores=[4, 8])
    rows = [line for line in out.splitlines() if line.startswith("| 2 |") or line.startswith("| 8 |")]
    assert rows[0].startswith("| 2 | 2 | 30 | 3.0 | 6.0 | 4.50 | 4 |")
    assert rows[1].startswith("| 8 | 8 | 30 | 14.0 | 24.0 | 4.75 | 4 |")
    assert "1000 hosts, forks 50, kubegpu_serial 25% (250 hosts a batch)" in out
    minutes = [line for line in out.splitlines() if line.startswith("| 4 |") or line.startswith("| 8 |")][-2:]
    assert [float(line.split("|")[2]) for line in minutes] == sorted(
        (float(line.split("|")[2]) for line in minutes), reverse=True
    )
    assert all(math.isfinite(float(line.split("|")[2])) for line in minutes)


def test_report_of_one_size_has_no_projection(tmp_path):
    out = fleet.report(
        [_write_run(tmp_path / "n02-r1", hosts=2, cpu_main=3.0, cpu_children=6.0)],
        hosts=1000,
        forks=50,
        serial_pct=25,
        cores=[4],
    )
    assert "Inputs" not in out


def test_write_inventory_uses_the_demos_settings_with_the_benchs_key(tmp_path):
    out = tmp_path / "fleet.yml"
    fleet.write_inventory(out, [("node-01", "10.0.0.1"), ("node-02", "10.0.0.2")], tmp_path / "ssh", 4)
    data = yaml.safe_load(out.read_text())
    group = data["all"]["children"]["gpu_nodes"]
    assert group["hosts"] == {
        "node-01": {"ansible_host": "10.0.0.1", "kubegpu_gpu_count": 4},
        "node-02": {"ansible_host": "10.0.0.2", "kubegpu_gpu_count": 4},
    }
    assert group["vars"]["ansible_ssh_private_key_file"] == str(tmp_path / "ssh" / "id_ed25519")
    assert f"UserKnownHostsFile={tmp_path / 'ssh' / 'known_hosts'}" in group["vars"]["ansible_ssh_common_args"]
    assert group["vars"]["ansible_user"] == "root"
    assert data["all"]["vars"]["kubegpu_validate_container"] is False


def test_truthy_reads_run_once_as_ansible_does():
    assert fleet._truthy(True)
    assert fleet._truthy("yes")
    assert not fleet._truthy("false")
    assert not fleet._truthy(None)


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("/v/lib/python3.11/site-packages/jinja2/environment.py", "Jinja2 templating"),
        ("/v/site-packages/ansible/_internal/_templating/_engine.py", "Jinja2 templating"),
        ("/v/site-packages/ansible/vars/manager.py", "variables and hostvars"),
        ("/v/site-packages/ansible/executor/module_common.py", "module transfer"),
        ("/v/site-packages/ansible/executor/task_executor.py", "the strategy and the task queue"),
        ("/c/ansible_collections/kubegpu/node/plugins/action/gpu_health.py", "action plugins on the controller"),
        ("/c/ansible_collections/kubernetes/core/plugins/module_utils/k8s/client.py", "Kubernetes client"),
        ("/v/site-packages/ansible/inventory/manager.py", "other ansible"),
        ("~", "other (Python built-ins"),
    ],
)
def test_area_names_where_a_function_belongs(filename, expected):
    assert fleet.area(filename).startswith(expected)


def test_profile_summary_sums_own_time_by_area(tmp_path):
    import cProfile

    profiler = cProfile.Profile()
    profiler.runcall(lambda: sum(i * i for i in range(20000)))
    profiler.dump_stats(str(tmp_path / "a.prof"))
    out = fleet.profile_summary([tmp_path / "a.prof"], top=3)
    assert out.splitlines()[0] == "| area | own CPU (s) | share |"
    assert "| all |" in out
    assert out.count("\n| `") == 3


def test_marks_command_prints_one_manager_and_document_a_line(tmp_path, capsys):
    node = tmp_path / "golden.json"
    node.write_text(json.dumps(GOLDEN))
    assert fleet.main(["marks", str(node), "kubegpu-bench-node-02"]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [manager for manager, _doc in lines] == ["kubegpu.node-gpu-labels", "kubegpu.node-validation"]
    assert json.loads(lines[1][1])["metadata"] == {
        "name": "kubegpu-bench-node-02",
        "annotations": {"kubegpu.node/validated": '{"driver": "580.95.05"}'},
    }


def test_projection_takes_a_tasks_latency_from_the_least_loaded_run(tmp_path):
    # bench/RESULTS.md, 2026-11-29: the mean task wall grew with the nodes (0.22, 0.56, 1.07 s at 2, 8, 16 on two
    # cores, load 0.9 to 5.9): the nodes are containers on the controller's machine, so a larger run's wall waits for
    # CPU, which the CPU bounds count. The quiet run's latency is the one on a real fleet's own nodes.
    quiet = _write_run(tmp_path / "n02-r1", hosts=2, cpu_main=1.0, cpu_children=2.0, wall=0.2, load=0.9)
    busy = _write_run(tmp_path / "n16-r1", hosts=16, cpu_main=8.0, cpu_children=16.0, wall=1.0, load=5.9)
    out = fleet.report([quiet, busy], hosts=1000, forks=50, serial_pct=25, cores=[16])
    assert "latency per task and wave 0.20 s (N=2, load 0.9; 1.00 s at N=16)" in out, out

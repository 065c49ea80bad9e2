"""bench/fleet's Python half: inventories, an accounted ansible-playbook run, SSH round trips and the fleet report.

    python bench/fleet.py inventory OUT --ssh-dir DIR NAME=ADDRESS...
    python bench/fleet.py run OUT [--profile-host HOST] [--profile-main] -- ANSIBLE-PLAYBOOK-ARGS...
    python bench/fleet.py report RUN-DIR... [--cores 4 8 16]
    python bench/fleet.py roundtrips LOG [--inventory demo/inventory.yml]
    python bench/fleet.py marks NODE-JSON NAME    (lines: MANAGER<tab>DOCUMENT)
    python bench/fleet.py profile PROF... [--top 15]

`run` runs ansible-playbook in this process, so that it can account for the controller's time without changing what
Ansible does:

- wall time; CPU seconds of the main process (strategy, variables, callbacks: one core at most) and of everything it
  started (task workers, ssh and sftp processes, modules run on the controller for delegated tasks). This process is a
  child subreaper, so the SSH ControlPersist masters that ssh detaches are reaped here too and their CPU counted;
- per task: the main process's CPU from one task's start to the next (queueing, results, callbacks), and each
  worker's CPU (its own, and the ssh processes it waited for), its wall time, its status and its SSH round trips: one
  per `ssh`/`sftp`/`scp` command the ssh connection runs (what `-vvv` prints as `SSH: EXEC`);
- the load average and the machine's CPU use (/proc/stat) every two seconds, for the record: the machine is shared;
- with --profile-main / --profile-host, cProfile (CPU time) of the main process and of the workers of one host.

It writes OUT/run.json (the summary) and OUT/tasks.jsonl (one line per host and task); ansible-playbook's own output
goes to stdout as usual. `report` turns one or more run directories into the tables and the projection of
bench/RESULTS.md; `roundtrips` counts SSH round trips per host, play, role and task in a `-vvv` log (make demo with
DEMO_VERBOSE=1); `marks` prints, for another node, what this collection's field managers applied to a converged node
(one server-side apply document per manager), so that a clone's Node carries what a converge left on it; `profile`
sums cProfile files (run --profile-main/--profile-host) by the part of Ansible or Python the time was spent in.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PR_SET_CHILD_SUBREAPER = 36
PLAY_NAMES = {
    "Preflight": "preflight play",
    "Make GPU nodes ready": "batch play",
    "Deploy NVIDIA's device plugin": "cluster play",
}


def play_label(name: str) -> str:
    """site.yml's plays by a short name; any other play by its own."""
    for prefix, label in PLAY_NAMES.items():
        if name.startswith(prefix):
            return label
    return name


def task_group(name: str) -> str:
    """The role a task belongs to ("kubegpu.node.kubelet : X" -> kubelet), else site.yml's own tasks."""
    role, sep, _rest = name.partition(" : ")
    return role.rsplit(".", 1)[-1] if sep else "site.yml"


# ----- inventory ----------------------------------------------------------------------------------------------------


def write_inventory(out: Path, hosts: list[tuple[str, str]], ssh_dir: Path, gpus: int) -> None:
    """demo/inventory.yml's settings (read, not copied) for other hosts, logging in with the key in ssh_dir."""
    import yaml

    demo = yaml.safe_load((ROOT / "demo" / "inventory.yml").read_text())
    group = demo["all"]["children"]["gpu_nodes"]
    group_vars = dict(group.get("vars") or {})
    group_vars["ansible_ssh_private_key_file"] = str(ssh_dir / "id_ed25519")
    group_vars["ansible_ssh_common_args"] = (
        f"-o UserKnownHostsFile={ssh_dir / 'known_hosts'} -o StrictHostKeyChecking=yes"
    )
    inventory = {
        "all": {
            "children": {
                "gpu_nodes": {
                    "hosts": {name: {"ansible_host": address, "kubegpu_gpu_count": gpus} for name, address in hosts},
                    "vars": group_vars,
                }
            },
            "vars": dict(demo["all"].get("vars") or {}),
        }
    }
    out.write_text(
        "# Written by bench/fleet.py from demo/inventory.yml's settings (do not edit).\n"
        + yaml.safe_dump(inventory, sort_keys=False)
    )


# ----- the accounted run --------------------------------------------------------------------------------------------


class Sampler(threading.Thread):
    """The load average and the machine's busy CPU share, every `interval` seconds."""

    def __init__(self, interval: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.samples: list[dict[str, float]] = []
        self._done = threading.Event()

    @staticmethod
    def _cpu() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)

    def run(self) -> None:
        busy0, total0 = self._cpu()
        while not self._done.wait(self.interval):
            busy1, total1 = self._cpu()
            load1 = float(Path("/proc/loadavg").read_text().split()[0])
            share = (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
            self.samples.append({"t": time.time(), "load1": load1, "busy": round(share, 3)})
            busy0, total0 = busy1, total1

    def stop(self) -> dict[str, float]:
        self._done.set()
        self.join()
        loads = [s["load1"] for s in self.samples] or [float(Path("/proc/loadavg").read_text().split()[0])]
        busy = [s["busy"] for s in self.samples] or [0.0]
        return {
            "load1_mean": round(sum(loads) / len(loads), 2),
            "load1_max": max(loads),
            "machine_busy_mean": round(sum(busy) / len(busy), 3),
            "cpus": os.cpu_count() or 0,
        }


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _control_masters(control_dir: str) -> list[int]:
    """The ssh ControlPersist masters of this run (their command line names this run's ControlPath folder)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and os.path.basename(cmdline[0]) == b"ssh" and any(control_dir.encode() in a for a in cmdline):
            pids.append(int(entry.name))
    return pids


def run_accounted(out: Path, playbook_args: list[str], profile_host: str | None, profile_main: bool) -> int:
    """ansible-playbook in this process, with the accounting the module docstring describes."""
    out.mkdir(parents=True, exist_ok=True)
    control_dir = str(out / "cp")
    os.makedirs(control_dir, exist_ok=True)
    # Each run starts without SSH connections, as an AWX job does in its fresh execution environment.
    os.environ["ANSIBLE_SSH_CONTROL_PATH_DIR"] = control_dir
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    import cProfile

    from ansible.executor.process.worker import WorkerProcess
    from ansible.executor.task_executor import TaskExecutor
    from ansible.executor.task_queue_manager import TaskQueueManager
    from ansible.plugins.connection import ssh as ssh_connection

    tasks_fd = os.open(out / "tasks.jsonl", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    state: dict[str, Any] = {"play": "", "marks": [], "ssh": 0, "worker": None, "started": 0.0}

    def cpu_self() -> float:
        t = os.times()
        return t.user + t.system

    original_send = TaskQueueManager.send_callback

    def send_callback(self: Any, method_name: str, *args: Any, **kwargs: Any) -> Any:
        if method_name == "v2_playbook_on_play_start":
            state["play"] = play_label(args[0].get_name())
            state["marks"].append(("play", state["play"], "", time.monotonic(), cpu_self()))
        elif method_name in ("v2_playbook_on_task_start", "v2_playbook_on_handler_task_start"):
            task = args[0]
            state["marks"].append(
                ("task", state["play"], task.get_name(), time.monotonic(), cpu_self(), _truthy(task.run_once))
            )
        elif method_name == "v2_playbook_on_stats":
            state["marks"].append(("end", state["play"], "", time.monotonic(), cpu_self()))
        return original_send(self, method_name, *args, **kwargs)

    TaskQueueManager.send_callback = send_callback  # type: ignore[method-assign]

    original_bare_run = ssh_connection.Connection._bare_run

    def bare_run(self: Any, cmd: Any, *args: Any, **kwargs: Any) -> Any:
        state["ssh"] += 1
        return original_bare_run(self, cmd, *args, **kwargs)

    ssh_connection.Connection._bare_run = bare_run  # type: ignore[method-assign]

    original_worker_run = WorkerProcess._run

    def worker_run(self: Any) -> None:
        state["started"] = time.monotonic()
        state["ssh"] = 0
        state["worker"] = self
        original_worker_run(self)

    # The record is written when the task's result is known, before the worker sends it: the main process ends the
    # workers still alive once the run is over, so a record written later could be lost.
    original_executor_run = TaskExecutor.run

    def executor_run(self: Any) -> Any:
        worker = state.get("worker")
        if worker is None:  # not in a worker
            return original_executor_run(self)
        profiler = None
        if profile_host and worker._host.get_name() == profile_host:
            profiler = cProfile.Profile(time.process_time)
            result = profiler.runcall(original_executor_run, self)
        else:
            result = original_executor_run(self)
        result_dict = result if isinstance(result, dict) else {}
        times = os.times()
        status = (
            "failed"
            if result_dict.get("failed") or result_dict.get("unreachable")
            else "skipped"
            if result_dict.get("skipped")
            else "changed"
            if result_dict.get("changed")
            else "ok"
        )
        record = {
            "play": state["play"],
            "task": worker._task.get_name(),
            "action": worker._task.action,
            "host": worker._host.get_name(),
            "delegated": bool(worker._task.delegate_to),
            "run_once": _truthy(worker._task.run_once),
            "status": status,
            "ssh": state["ssh"],
            "cpu": round(times.user + times.system, 4),
            "cpu_children": round(times.children_user + times.children_system, 4),
            "wall": round(time.monotonic() - state["started"], 4),
        }
        os.write(tasks_fd, (json.dumps(record) + "\n").encode())
        if profiler is not None:
            profiler.dump_stats(str(out / f"worker-{os.getpid()}.prof"))
        return result

    TaskExecutor.run = executor_run  # type: ignore[method-assign]

    WorkerProcess._run = worker_run  # type: ignore[method-assign]

    from ansible.cli.playbook import PlaybookCLI

    sampler = Sampler()
    sampler.start()
    started_wall = time.monotonic()
    started_cpu = os.times()
    main_profiler = cProfile.Profile(time.process_time) if profile_main else None
    exit_code = 0
    try:
        if main_profiler is not None:
            main_profiler.runcall(PlaybookCLI.cli_executor, ["ansible-playbook", *playbook_args])
        else:
            PlaybookCLI.cli_executor(["ansible-playbook", *playbook_args])
    except SystemExit as exc:
        exit_code = exc.code if isinstance(exc.code, int) else 1
    wall = time.monotonic() - started_wall
    sys.stdout.flush()
    if main_profiler is not None:
        main_profiler.dump_stats(str(out / "main.prof"))
    # The ssh masters still running: their CPU until now, then end them (they are this run's) and reap them, with
    # any that ended by themselves (ControlPersist), so that RUSAGE_CHILDREN holds them.
    masters = _control_masters(control_dir)
    for pid in masters:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
    ended_cpu = os.times()
    load = sampler.stop()
    os.close(tasks_fd)

    marks = state["marks"]
    main_per_task = []
    for mark, following in zip(marks, marks[1:]):
        if mark[0] == "task":
            main_per_task.append(
                {
                    "play": mark[1],
                    "task": mark[2],
                    "wall": round(following[3] - mark[3], 3),
                    "cpu": round(following[4] - mark[4], 4),
                    "run_once": mark[5],
                }
            )
    summary = {
        "args": playbook_args,
        "exit_code": exit_code,
        "wall_s": round(wall, 2),
        "cpu_main_s": round(ended_cpu.user + ended_cpu.system - started_cpu.user - started_cpu.system, 2),
        "cpu_children_s": round(
            ended_cpu.children_user
            + ended_cpu.children_system
            - started_cpu.children_user
            - started_cpu.children_system,
            2,
        ),
        "ssh_masters_ended": len(masters),
        "load": load,
        "main_per_task": main_per_task,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
    }
    (out / "run.json").write_text(json.dumps(summary, indent=1) + "\n")
    return exit_code


def _truthy(value: Any) -> bool:
    """A task keyword as Ansible reads it (run_once may be a string from YAML or a template already resolved)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1", "y", "t")
    return bool(value)


def _machine() -> str:
    import platform

    return f"{platform.node()} ({os.cpu_count()} CPUs, {platform.platform()}), Python {platform.python_version()}"


# ----- reading runs back ----------------------------------------------------------------------------------------------


def load_tasks(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "tasks.jsonl").read_text().splitlines() if line.strip()]


def per_host(tasks: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per inventory host: host-tasks run (workers), SSH round trips, worker CPU (with its ssh), wall in workers."""
    hosts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for t in tasks:
        h = hosts[t["host"]]
        h["host_tasks"] += 1
        h["skipped"] += t["status"] == "skipped"
        h["ssh"] += t["ssh"]
        h["cpu"] += t["cpu"] + t["cpu_children"]
    return hosts


def table(rows: list[list[Any]], header: list[str], align: str) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def roundtrip_table(tasks: list[dict[str, Any]]) -> str:
    """SSH round trips per host on one run, by play and role, then the tasks that make them (one host's view: the
    mean over hosts, which differ only where a host takes another branch)."""
    hosts = sorted({t["host"] for t in tasks})
    by_group: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    by_task: dict[tuple[str, str, str], float] = defaultdict(float)
    for t in tasks:
        group = (t["play"], task_group(t["task"]))
        by_group[group][0] += t["ssh"] / len(hosts)
        by_group[group][1] += 1 / len(hosts)
        by_group[group][2] += (t["status"] != "skipped") / len(hosts)
        if t["ssh"]:
            by_task[(t["play"], task_group(t["task"]), t["task"])] += t["ssh"] / len(hosts)
    total = sum(v[0] for v in by_group.values())
    rows = [
        [play, group, f"{v[1]:.0f}", f"{v[2]:.0f}", f"{v[0]:.1f}"]
        for (play, group), v in sorted(by_group.items(), key=lambda kv: -kv[1][0])
    ]
    rows.append(
        [
            "all",
            "",
            f"{sum(v[1] for v in by_group.values()):.0f}",
            f"{sum(v[2] for v in by_group.values()):.0f}",
            f"{total:.1f}",
        ]
    )
    out = [table(rows, ["play", "role or file", "host-tasks", "not skipped", "SSH round trips per host"], "llrrr")]
    task_rows = [
        [play, f"`{name}`", f"{v:.1f}"]
        for (play, _group, name), v in sorted(by_task.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    out.append(table(task_rows, ["play", "task", "SSH round trips per host"], "llr"))
    return "\n\n".join(out)


def where_time_goes(run_dir: Path, top: int = 15) -> str:
    """The controller's CPU by play and role (main process and workers), and the costliest tasks."""
    summary = json.loads((run_dir / "run.json").read_text())
    tasks = load_tasks(run_dir)
    hosts = len({t["host"] for t in tasks}) or 1
    main: dict[tuple[str, str], float] = defaultdict(float)
    for m in summary["main_per_task"]:
        main[(m["play"], task_group(m["task"]))] += m["cpu"]
    workers: dict[tuple[str, str], float] = defaultdict(float)
    count: dict[tuple[str, str], int] = defaultdict(int)
    for t in tasks:
        workers[(t["play"], task_group(t["task"]))] += t["cpu"] + t["cpu_children"]
        count[(t["play"], task_group(t["task"]))] += 1
    keys = sorted(set(main) | set(workers), key=lambda k: -(main[k] + workers[k]))
    rows = [
        [
            play,
            group,
            f"{count[(play, group)] / hosts:.0f}",
            f"{main[(play, group)]:.1f}",
            f"{workers[(play, group)]:.1f}",
            f"{(main[(play, group)] + workers[(play, group)]) / hosts:.2f}",
        ]
        for play, group in keys
    ]
    accounted = sum(main.values()) + sum(workers.values())
    rows.append(
        [
            "all",
            "",
            f"{len(tasks) / hosts:.0f}",
            f"{sum(main.values()):.1f}",
            f"{sum(workers.values()):.1f}",
            f"{accounted / hosts:.2f}",
        ]
    )
    out = [
        table(
            rows,
            [
                "play",
                "role or file",
                "host-tasks per host",
                "main process CPU (s)",
                "workers + their ssh CPU (s)",
                "CPU per host (s)",
            ],
            "llrrrr",
        )
    ]
    per_task: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for t in tasks:
        v = per_task[(t["play"], t["task"], t["action"])]
        v[0] += t["cpu"] + t["cpu_children"]
        v[1] += 1
        v[2] += t["wall"]
    rows = [
        [play, f"`{name}`", action, f"{v[0] / v[1] * 1000:.0f}", f"{v[2] / v[1]:.2f}"]
        for (play, name, action), v in sorted(per_task.items(), key=lambda kv: -kv[1][0])[:top]
    ]
    out.append(table(rows, ["play", "task", "action", "worker CPU per host (ms)", "worker wall per host (s)"], "lllrr"))
    return "\n\n".join(out)


def action_table(run_dir: Path) -> str:
    """Worker CPU and wall per host-task by action (module), skipped host-tasks apart."""
    tasks = load_tasks(run_dir)
    acc: dict[tuple[str, bool], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for t in tasks:
        key = (t["action"] + (" (delegated)" if t["delegated"] else ""), t["status"] == "skipped")
        v = acc[key]
        v[0] += 1
        v[1] += t["cpu"] + t["cpu_children"]
        v[2] += t["wall"]
        v[3] += t["ssh"]
    rows = [
        [
            f"`{action}`",
            "skipped" if skipped else "run",
            f"{v[0]:.0f}",
            f"{v[1] / v[0] * 1000:.0f}",
            f"{v[2] / v[0]:.2f}",
            f"{v[3] / v[0]:.1f}",
            f"{v[1]:.1f}",
        ]
        for (action, skipped), v in sorted(acc.items(), key=lambda kv: -kv[1][1])
    ]
    return table(
        rows, ["action", "", "host-tasks", "CPU each (ms)", "wall each (s)", "SSH each", "CPU in all (s)"], "llrrrrr"
    )


# ----- the projection -----------------------------------------------------------------------------------------------


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def cost_model(ns: list[float], ys: list[float]) -> tuple[float, float]:
    """A per-host-task cost as a + b x hosts for the projection: the least-squares line where the cost grows with
    the number of hosts (the main process's does: more hosts, more variables to walk), and otherwise the cost at the
    largest size measured, held flat. A cost that falls between small sizes (the fixed start-up of a run spread over
    more hosts, spare cores) must not be extrapolated: a line through it reaches zero, then negative CPU."""
    a, b = fit_line(ns, ys)
    if b > 0:
        return a, b
    largest = max(range(len(ns)), key=lambda i: ns[i])
    return ys[largest], 0.0


def projected_seconds(
    model: dict[str, Any], hosts: int, forks: int, serial_pct: float, cores: int
) -> tuple[float, list[str]]:
    """A no-op run's wall time on `hosts` nodes from one controller with `cores` cores, and how each play makes it.

    model: main_ms and work_ms (the main process's and the workers' with their ssh CPU per host-task, in ms),
    latency_s (a task's wall time on one node), tasks_per_play ({play: host-tasks per host}) and cluster_s (the
    run_once steps outside the batch play). Each play (each batch, in the batch play) takes the longest of three
    bounds: its tasks one after another, each in ceil(hosts / forks) waves of latency_s (the linear strategy waits
    for every host before the next task); the main process, one core, handling each host-task; and all the CPU the
    host-tasks need spread over the cores."""
    batch = max(1, math.floor(hosts * serial_pct / 100))
    total = model["cluster_s"]
    parts = []
    for play, per_host_tasks in model["tasks_per_play"].items():
        play_hosts = batch if play == "batch play" else hosts
        batches = math.ceil(hosts / play_hosts)
        host_tasks = per_host_tasks * play_hosts
        waves = math.ceil(play_hosts / forks)
        latency_bound = per_host_tasks * waves * model["latency_s"]
        main_bound = host_tasks * model["main_ms"] / 1000
        cpu_bound = host_tasks * (model["main_ms"] + model["work_ms"]) / 1000 / cores
        total += max(latency_bound, main_bound, cpu_bound) * batches
        parts.append(f"{play}: {batches} x max({latency_bound:.0f}, {main_bound:.0f}, {cpu_bound:.0f}) s")
    return total, parts


def projection(runs: list[dict[str, Any]], hosts: int, forks: int, serial_pct: float, cores: list[int]) -> str:
    """The time of a no-op run on `hosts` nodes from one controller (see bench/RESULTS.md for the model): the CPU per
    host-task from the sizes measured (cost_model: a line in the number of hosts where it grows, else the largest
    size's), the rest from the largest run."""
    ns = [r["n"] for r in runs]
    main_a, main_b = cost_model(ns, [r["main_per_host_task_ms"] for r in runs])
    work_a, work_b = cost_model(ns, [r["worker_per_host_task_ms"] for r in runs])
    biggest = max(runs, key=lambda r: r["n"])
    # A task's latency on a node from the least loaded run (the smallest size): bench/fleet's nodes are containers on
    # the controller's own machine, so in a larger run a task's wall time also waits for a CPU that the nodes' own work
    # and the other workers take (it grew with the number of nodes: 0.22, 0.56 and 1.07 s at 2, 8 and 16 on two
    # cores), which the CPU bounds count already. A real fleet's nodes do their work on their own CPUs.
    quiet = min(runs, key=lambda r: (r["load"]["load1_mean"], r["n"]))
    model = {
        "main_ms": main_a + main_b * hosts,
        "work_ms": work_a + work_b * hosts,
        "latency_s": quiet["latency_per_task_s"],
        "tasks_per_play": biggest["tasks_per_play"],
        "cluster_s": biggest["cluster_steps_s"],
    }
    batch = max(1, math.floor(hosts * serial_pct / 100))
    rows = []
    for c in cores:
        total, parts = projected_seconds(model, hosts, forks, serial_pct, c)
        rows.append([c, f"{total / 60:.1f}", "; ".join(parts)])
    plays = ", ".join(f"{k} {v:.0f}" for k, v in model["tasks_per_play"].items())
    head = (
        f"Inputs (from the runs): main process {main_a:.2f} + {main_b:.4f} x hosts ms per host-task "
        f"({model['main_ms']:.1f} ms at {hosts}); workers and ssh {work_a:.1f} + {work_b:.3f} x hosts ms per host-task "
        f"({model['work_ms']:.1f} ms); {biggest['host_tasks_per_host']:.0f} host-tasks per host ({plays}); "
        f"latency per task and wave {model['latency_s']:.2f} s (N={quiet['n']}, load {quiet['load']['load1_mean']}; "
        f"{biggest['latency_per_task_s']:.2f} s at N={biggest['n']}); the run_once cluster steps "
        f"{model['cluster_s']:.0f} s. {hosts} hosts, forks {forks}, kubegpu_serial {serial_pct:g}% "
        f"({batch} hosts a batch)."
    )
    return (
        head
        + "\n\n"
        + table(
            rows,
            ["controller cores", "projected minutes", "per play: batches x max(latency, main process, CPU) bound"],
            "rrl",
        )
    )


def summarise_run(run_dir: Path) -> dict[str, Any]:
    summary = json.loads((run_dir / "run.json").read_text())
    tasks = load_tasks(run_dir)
    hosts = sorted({t["host"] for t in tasks})
    n = len(hosts)
    node_tasks = [t for t in tasks if not t["delegated"]]
    host_tasks = len(tasks)
    per = per_host(tasks)
    ssh = [per[h]["ssh"] for h in hosts]
    main_cpu = summary["cpu_main_s"]
    children = summary["cpu_children_s"]
    tasks_per_play: dict[str, float] = defaultdict(float)
    for t in tasks:
        tasks_per_play[t["play"]] += 1 / n
    cluster_s = cluster_steps_s(summary["main_per_task"])
    # Latency per task and wave: the mean wall time of a worker that ran on a node (not skipped), at this size.
    ran = [t for t in node_tasks if t["status"] != "skipped"]
    latency = sum(t["wall"] for t in ran) / len(ran) if ran else 0.0
    return {
        "n": n,
        "dir": str(run_dir),
        "wall_s": summary["wall_s"],
        "cpu_main_s": main_cpu,
        "cpu_children_s": children,
        "cpu_per_host_s": round((main_cpu + children) / n, 2),
        "host_tasks_per_host": host_tasks / n,
        "main_per_host_task_ms": main_cpu / host_tasks * 1000,
        "worker_per_host_task_ms": children / host_tasks * 1000,
        "ssh_min": min(ssh),
        "ssh_max": max(ssh),
        "tasks_per_play": dict(tasks_per_play),
        "cluster_steps_s": cluster_s,
        "latency_per_task_s": latency,
        "load": summary["load"],
        "when": summary["when"],
        "exit_code": summary["exit_code"],
        "forks": _arg(summary["args"], "--forks"),
    }


def cluster_steps_s(main_per_task: list[dict[str, Any]]) -> float:
    """The wall time of the run_once steps outside the batch play (the cluster's node list, the device plugin's and the
    DCGM exporter's apply and wait, the validation's reads): run once per run, whatever the number of hosts. The
    batch play's run_once steps run once per batch and are counted with its tasks."""
    return sum(m["wall"] for m in main_per_task if m.get("run_once") and m["play"] != "batch play")


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1] if name in args else ""


def report(run_dirs: list[Path], hosts: int, forks: int, serial_pct: float, cores: list[int]) -> str:
    runs = [summarise_run(d) for d in run_dirs]
    rows = [
        [
            r["n"],
            r["forks"],
            f"{r['wall_s']:.0f}",
            f"{r['cpu_main_s']:.1f}",
            f"{r['cpu_children_s']:.1f}",
            f"{r['cpu_per_host_s']:.2f}",
            f"{r['host_tasks_per_host']:.0f}",
            f"{r['main_per_host_task_ms']:.1f}",
            f"{r['worker_per_host_task_ms']:.0f}",
            f"{r['ssh_min']:.0f}-{r['ssh_max']:.0f}",
            f"{r['load']['load1_mean']:.1f} (max {r['load']['load1_max']:.1f})",
            r["exit_code"],
        ]
        for r in sorted(runs, key=lambda r: (r["n"], r["when"]))
    ]
    out = [
        table(
            rows,
            [
                "hosts",
                "forks",
                "wall (s)",
                "main process CPU (s)",
                "workers + ssh CPU (s)",
                "CPU per host (s)",
                "host-tasks per host",
                "main CPU per host-task (ms)",
                "worker CPU per host-task (ms)",
                "SSH round trips per host",
                "load average (1 min) during the run",
                "exit",
            ],
            "rrrrrrrrrrlr",
        )
    ]
    by_n: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_n[r["n"]].append(r)
    best = [min(group, key=lambda r: r["cpu_main_s"] + r["cpu_children_s"]) for group in by_n.values()]
    if len(best) >= 2:
        out.append(projection(best, hosts, forks, serial_pct, cores))
    return "\n\n".join(out)


# ----- -vvv logs ------------------------------------------------------------------------------------------------------

_TASK = re.compile(r"^TASK \[(.*)\] \*+")
_PLAY = re.compile(r"^PLAY \[(.*)\] \*+")
_EXEC = re.compile(r"^<([^>]+)> SSH: EXEC (ssh|sftp|scp)\b")


def count_log(path: Path) -> dict[tuple[str, str, str], dict[str, int]]:
    """SSH commands per (play, role, task) and address in a -vvv log."""
    counts: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    play, task = "", ""
    for line in path.read_text(errors="replace").splitlines():
        if m := _PLAY.match(line):
            play = play_label(m.group(1))
        elif m := _TASK.match(line):
            task = m.group(1)
        elif m := _EXEC.match(line):
            counts[(play, task_group(task), task)][m.group(1)] += 1
    return counts


def roundtrips_report(path: Path, addresses: dict[str, str]) -> str:
    counts = count_log(path)
    hosts = sorted({a for v in counts.values() for a in v})
    names = [addresses.get(a, a) for a in hosts]
    groups: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (play, group, _task), per in counts.items():
        for a, c in per.items():
            groups[(play, group)][a] += c
    rows = [[play, group, *[groups[(play, group)].get(a, 0) for a in hosts]] for (play, group) in groups]
    rows.append(["all", "", *[sum(per.get(a, 0) for per in groups.values()) for a in hosts]])
    out = [table(rows, ["play", "role or file", *names], "ll" + "r" * len(hosts))]
    task_rows = [
        [play, f"`{task}`", *[per.get(a, 0) for a in hosts]]
        for (play, _group, task), per in sorted(counts.items(), key=lambda kv: -max(kv[1].values()))
    ]
    out.append(table(task_rows, ["play", "task", *names], "ll" + "r" * len(hosts)))
    return "\n\n".join(out)


# ----- cProfile files, by area -----------------------------------------------------------------------------------

# (area, substrings of a function's file, the first that matches wins): the parts of Ansible and Python a no-op run's
# controller time goes to.
AREAS = [
    (
        "Jinja2 templating (ansible.template, jinja2)",
        ("/ansible/template/", "/ansible/_internal/_templating/", "/jinja2/"),
    ),
    ("variables and hostvars (ansible.vars)", ("/ansible/vars/",)),
    ("module transfer (ansible.executor.module_common, zip)", ("module_common", "/zipfile")),
    (
        "the strategy and the task queue (ansible.plugins.strategy, executor)",
        ("/ansible/plugins/strategy/", "/ansible/executor/"),
    ),
    ("the ssh connection (ansible.plugins.connection)", ("/ansible/plugins/connection/",)),
    (
        "action plugins on the controller (ansible.plugins.action, this collection's)",
        ("/ansible/plugins/action/", "/kubegpu/node/plugins/"),
    ),
    (
        "callbacks and display",
        (
            "/ansible/plugins/callback/",
            "/ansible/utils/display",
            "/ansible_collections/ansible/posix/plugins/callback/",
        ),
    ),
    ("playbook objects (ansible.playbook: tasks, blocks, includes)", ("/ansible/playbook/",)),
    ("YAML, JSON, pickling", ("/yaml/", "/json/", "pickle", "/_internal/_json/")),
    (
        "processes, pipes, queues (fork, multiprocessing, selectors)",
        ("/multiprocessing/", "subprocess", "selectors", "threading", "queue"),
    ),
    (
        "Kubernetes client (kubernetes.core, kubernetes, urllib3)",
        ("/kubernetes/", "/kubernetes_core/", "/urllib3/", "/ansible_collections/kubernetes/"),
    ),
    ("other ansible", ("/ansible/",)),
]


def area(filename: str) -> str:
    """The AREAS entry a function defined in `filename` belongs to; built-ins and the rest are 'other'."""
    for name, parts in AREAS:
        if any(part in filename for part in parts):
            return name
    return "other (Python built-ins, the standard library)"


def profile_summary(paths: list[Path], top: int = 15) -> str:
    """Own CPU time (tottime) of the profiled processes, by area, then the functions with the most own time."""
    import pstats

    stats = pstats.Stats(*[str(p) for p in paths])
    by_area: dict[str, float] = defaultdict(float)
    functions = []
    total = 0.0
    for (filename, line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        by_area[area(filename)] += tottime
        total += tottime
        functions.append((tottime, f"{Path(filename).name}:{line} {name}", area(filename)))
    rows = [
        [name, f"{t:.2f}", f"{t / total * 100:.0f}%" if total else "-"]
        for name, t in sorted(by_area.items(), key=lambda kv: -kv[1])
    ]
    rows.append(["all", f"{total:.2f}", "100%"])
    out = [table(rows, ["area", "own CPU (s)", "share"], "lrr")]
    fn_rows = [[f"`{fn}`", a, f"{t:.2f}"] for t, fn, a in sorted(functions, reverse=True)[:top]]
    out.append(table(fn_rows, ["function", "area", "own CPU (s)"], "llr"))
    return "\n\n".join(out)


# ----- a converged node's marks, for its clones -----------------------------------------------------------------------


def node_marks(node: dict[str, Any], name: str, prefix: str = "kubegpu.node") -> list[tuple[str, dict[str, Any]]]:
    """[(field manager, server-side apply document for Node `name`)]: the labels and annotations that each field
    manager named `prefix`* applied (operation Apply) to `node`, with their values on it. Only metadata: a clone is
    healthy and schedulable like the node it was made from, so taints and spec fields are not copied."""
    meta = node.get("metadata") or {}
    out: list[tuple[str, dict[str, Any]]] = []
    for entry in meta.get("managedFields") or []:
        manager = entry.get("manager", "")
        if not manager.startswith(prefix) or entry.get("operation") != "Apply" or entry.get("subresource"):
            continue
        fields = (entry.get("fieldsV1") or {}).get("f:metadata") or {}
        marks: dict[str, dict[str, str]] = {}
        for kind in ("labels", "annotations"):
            values = meta.get(kind) or {}
            keys = [k[2:] for k in fields.get(f"f:{kind}") or {} if k.startswith("f:")]
            picked = {k: values[k] for k in keys if k in values}
            if picked:
                marks[kind] = picked
        if marks:
            out.append((manager, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, **marks}}))
    return sorted(out, key=lambda m: m[0])


def _inventory_addresses(path: Path) -> dict[str, str]:
    import yaml

    data = yaml.safe_load(path.read_text())
    hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
    return {v["ansible_host"]: k for k, v in hosts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    inv = commands.add_parser("inventory")
    inv.add_argument("out", type=Path)
    inv.add_argument("hosts", nargs="+", metavar="NAME=ADDRESS")
    inv.add_argument("--ssh-dir", type=Path, required=True)
    inv.add_argument("--gpus", type=int, default=4)
    run = commands.add_parser("run")
    run.add_argument("out", type=Path)
    run.add_argument("--profile-host")
    run.add_argument("--profile-main", action="store_true")
    rep = commands.add_parser("report")
    rep.add_argument("runs", nargs="+", type=Path)
    rep.add_argument("--hosts", type=int, default=1000)
    rep.add_argument("--forks", type=int, default=50)
    rep.add_argument("--serial", type=float, default=25.0, help="kubegpu_serial in percent")
    rep.add_argument("--cores", type=int, nargs="+", default=[4, 8, 16])
    rep.add_argument("--detail", type=Path, help="a run directory whose round trips and CPU to break down")
    mk = commands.add_parser("marks")
    mk.add_argument("node", type=Path, help="the converged node, as `kubectl get node NAME -o json` prints it")
    mk.add_argument("name", help="the clone's node name")
    prof = commands.add_parser("profile")
    prof.add_argument("files", nargs="+", type=Path)
    prof.add_argument("--top", type=int, default=15)
    rt = commands.add_parser("roundtrips")
    rt.add_argument("log", type=Path)
    rt.add_argument("--inventory", type=Path, default=ROOT / "demo" / "inventory.yml")
    argv = list(sys.argv[1:] if argv is None else argv)
    playbook_args: list[str] = []
    if "--" in argv:
        playbook_args = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = parser.parse_args(argv)

    if args.command == "inventory":
        hosts = [tuple(h.split("=", 1)) for h in args.hosts]
        write_inventory(args.out, hosts, args.ssh_dir.resolve(), args.gpus)  # type: ignore[arg-type]
        return 0
    if args.command == "marks":
        for manager, doc in node_marks(json.loads(args.node.read_text()), args.name):
            print(f"{manager}\t{json.dumps(doc)}")
        return 0
    if args.command == "profile":
        print(profile_summary(args.files, args.top))
        return 0
    if args.command == "run":
        return run_accounted(args.out, playbook_args, args.profile_host, args.profile_main)
    if args.command == "report":
        print(report(args.runs, args.hosts, args.forks, args.serial, args.cores))
        if args.detail:
            tasks = load_tasks(args.detail)
            print()
            print(roundtrip_table(tasks))
            print()
            print(where_time_goes(args.detail))
            print()
            print(action_table(args.detail))
        return 0
    print(roundtrips_report(args.log, _inventory_addresses(args.inventory)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: how fast and how cheaply each waiter sees every node's nvidia.com/gpu capacity.

For each cluster size, a fresh simulated API server (tests/kubesim, in this process) holds N GPU nodes; the device
plugin's DaemonSet is applied, and capacity then appears across the nodes over a few seconds. Three waiters run, one
at a time, each in its own process:

- module:   kubegpu.node.nvidia_device_plugin with wait: true (it also applies the DaemonSet), via ansible-playbook;
- k8s_info: the usual Ansible idiom, kubernetes.core.k8s_info on Nodes in an until/retries loop with a 5 s delay;
- kubectl:  `kubectl wait nodes -l ... --for=jsonpath='{.status.capacity.nvidia\\.com/gpu}'=8`.

Figures per waiter: detection latency (time from the last node's capacity to the waiter's exit), API requests it
made, CPU seconds and peak RSS of its process tree (GNU time, Debian's `time` package). Run:

    make venv link kubectl && .venv/bin/python bench/wait_capacity.py --sizes 100 1000 5000 --output bench/RESULTS.md

With ``--throttle 0.5 --retry-after 1`` the simulator answers half of all requests with 429 and ``Retry-After: 1``
while the capacity appears, and a second table gives each waiter's request rate in that window, its 429 answers, its
node lists and the shortest gap between two of them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from kubesim import SimCluster, SimNode

GPUS = 8
GNU_TIME = "/usr/bin/time"  # Debian's `time` package
LABEL = "kubegpu.bench/gpu"
DAEMONSET = "nvidia-device-plugin-daemonset"
WAITERS = ["module", "k8s_info", "kubectl"]


@dataclass
class Result:
    waiter: str
    nodes: int
    ok: bool
    latency_s: float
    requests: int
    cpu_s: float
    peak_rss_mib: float
    wall_s: float
    note: str = ""
    # With --throttle: while capacity appeared (the waiter's start to the last capacity), requests per second sent,
    # how many were answered 429, node lists sent, and the shortest gap between two node lists.
    throttled_rps: float = 0.0
    throttled_429: int = 0
    throttled_lists: int = 0
    min_list_gap_s: float | None = None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{ROOT / '.tmp' / 'bin'}:{env.get('PATH', '')}"
    env["ANSIBLE_COLLECTIONS_PATH"] = str(ROOT / ".tmp" / "collections")
    env["PYTHONPATH"] = str(ROOT / ".tmp" / "collections")
    env["ANSIBLE_STDOUT_CALLBACK"] = "default"
    env["ANSIBLE_LOCALHOST_WARNING"] = "false"
    env["ANSIBLE_INVENTORY_UNPARSED_WARNING"] = "false"
    return env


def _run(cmd: list[str], log: Path, timeout: float) -> tuple[int, float, float, float]:
    """Run a command; return (exit code, end as time.time(), CPU seconds, peak RSS MiB) of its process tree.

    GNU time measures: a child forked straight from this process would start with this process's high-water RSS
    (the simulator's thousands of nodes) and report that as its own peak.
    """
    usage_file = log.with_suffix(".rusage")
    measured = [GNU_TIME, "-f", "%U %S %M", "-o", str(usage_file), *cmd]
    with log.open("wb") as out:
        try:
            finished = subprocess.run(
                measured, stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT, timeout=timeout, check=False
            )
            code = finished.returncode
        except subprocess.TimeoutExpired:
            code = -1
    end = time.time()
    fields = usage_file.read_text().split()[-3:] if usage_file.exists() else ["0", "0", "0"]
    user, system, max_rss_kib = (float(value) for value in fields)
    return code, end, user + system, max_rss_kib / 1024.0


class CapacityClock:
    """Notes when the last node gained capacity, from the simulator's own records (no API traffic).

    The simulator stamps each node's capacity with time.time(); polling only decides when all are in, so a slow poll
    costs no precision.
    """

    def __init__(self, cluster: SimCluster, expected: int, on_complete=None) -> None:
        self.cluster = cluster
        self.expected = expected
        self.on_complete = on_complete
        self.last: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            times = self.cluster.capacity_times()
            if len(times) >= self.expected:
                self.last = max(times.values())
                if self.on_complete is not None:
                    self.on_complete()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.last is None:
            times = self.cluster.capacity_times()
            if len(times) >= self.expected:
                self.last = max(times.values())


def _cluster(size: int, delay: float, spread: float) -> SimCluster:
    nodes = [SimNode(f"gpu-node-{i:05d}", gpus=GPUS, labels={LABEL: "true"}) for i in range(1, size + 1)]
    return SimCluster(nodes=nodes, tls=True, token="bench-token", capacity_delay=delay, capacity_spread=spread)


def _module_playbook(work: Path, kubeconfig: Path, size: int, wait: bool) -> Path:
    expected = {f"gpu-node-{i:05d}": GPUS for i in range(1, size + 1)}
    (work / "expected.json").write_text(json.dumps({"expected": expected}))
    playbook = work / f"module-{'wait' if wait else 'apply'}.yml"
    playbook.write_text(
        textwrap.dedent(
            f"""\
            - hosts: localhost
              gather_facts: false
              tasks:
                - kubegpu.node.nvidia_device_plugin:
                    kubeconfig: {kubeconfig}
                    node_selector: {{"{LABEL}": "true"}}
                    wait: {str(wait).lower()}
                    wait_timeout: 300
                    expected_gpus: "{{{{ expected }}}}"
            """
        )
    )
    return playbook


def _k8s_info_playbook(work: Path, kubeconfig: Path, size: int) -> Path:
    playbook = work / "k8s_info.yml"
    playbook.write_text(
        textwrap.dedent(
            f"""\
            - hosts: localhost
              gather_facts: false
              tasks:
                - kubernetes.core.k8s_info:
                    kubeconfig: {kubeconfig}
                    kind: Node
                    label_selectors: ["{LABEL}=true"]
                  register: nodes
                  until: >-
                    nodes.resources | community.general.json_query(
                    "[?status.capacity.\\"nvidia.com/gpu\\" == '{GPUS}'] | length(@)") == {size}
                  retries: 60
                  delay: 5
            """
        )
    )
    return playbook


def _throttle_figures(result: Result, cluster: SimCluster, start: float, last: float, offset: float) -> None:
    """Fill the throttled-window figures from the simulator's request log (monotonic times; offset to time.time)."""
    window = [entry for entry in cluster.request_log() if start <= entry[0] + offset <= last]
    seconds = max(last - start, 1e-6)
    result.throttled_rps = len(window) / seconds
    result.throttled_429 = sum(1 for entry in window if entry[3] == 429)
    lists = [entry[0] for entry in window if entry[1] == "list" and entry[2] == "nodes"]
    result.throttled_lists = len(lists)
    gaps = [later - earlier for earlier, later in zip(lists, lists[1:])]
    result.min_list_gap_s = min(gaps) if gaps else None


def run_one(
    waiter: str, size: int, work: Path, delay: float, spread: float, throttle: float = 0.0, retry_after: int = 1
) -> Result:
    with _cluster(size, delay, spread) as cluster:
        kubeconfig = work / "kubeconfig"
        cluster.write_kubeconfig(str(kubeconfig))
        ansible = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local"]
        ansible += ["-e", f"ansible_python_interpreter={ROOT / '.venv' / 'bin' / 'python'}"]
        expected = ["-e", f"@{work / 'expected.json'}"]
        if waiter == "module":
            cmd = [*ansible, str(_module_playbook(work, kubeconfig, size, wait=True)), *expected]
        else:
            # The peers only wait: apply the DaemonSet first, without waiting, with the module itself.
            apply = [*ansible, str(_module_playbook(work, kubeconfig, size, wait=False)), *expected]
            code = _run(apply, work / f"{waiter}-{size}-apply.log", timeout=300)[0]
            if code != 0:
                return Result(waiter, size, False, 0, 0, 0, 0, 0, "applying the DaemonSet failed")
            if waiter == "k8s_info":
                cmd = [*ansible, str(_k8s_info_playbook(work, kubeconfig, size))]
            else:
                cmd = [
                    str(ROOT / ".tmp" / "bin" / "kubectl"),
                    f"--kubeconfig={kubeconfig}",
                    "wait",
                    "nodes",
                    "-l",
                    f"{LABEL}=true",
                    f"--for=jsonpath={{.status.capacity.nvidia\\.com/gpu}}={GPUS}",
                    "--timeout=600s",
                ]
        cluster.reset_counts()
        offset = time.time() - time.monotonic()
        if throttle:
            # API Priority and Fairness under load: a share of all requests answered 429 with Retry-After while the
            # capacity appears; it stops once the last node has its capacity.
            cluster.throttle(share=throttle, retry_after=retry_after)
        clock = CapacityClock(cluster, size, on_complete=cluster.stop_throttle if throttle else None)
        start = time.time()
        code, end, cpu, rss = _run(cmd, work / f"{waiter}-{size}.log", timeout=660)
        clock.stop()
        cluster.stop_throttle()
        requests = cluster.request_counts()["total"]
        if clock.last is None:
            return Result(waiter, size, False, 0, requests, cpu, rss, end - start, "capacity never complete")
        result = Result(waiter, size, code == 0, end - clock.last, requests, cpu, rss, end - start)
        if throttle:
            _throttle_figures(result, cluster, start, clock.last, offset)
        return result


def measure_floor(work: Path) -> tuple[float, float]:
    """CPU seconds and peak RSS of ansible-playbook running one ping task: what any Ansible-driven waiter pays."""
    playbook = work / "floor.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n")
    runs = []
    for attempt in range(3):
        cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)]
        cmd += ["-e", f"ansible_python_interpreter={ROOT / '.venv' / 'bin' / 'python'}"]
        code, _end, cpu, rss = _run(cmd, work / f"floor-{attempt}.log", timeout=120)
        if code == 0:
            runs.append((cpu, rss))
    return min(runs) if runs else (0.0, 0.0)


def render(results: list[Result], args: argparse.Namespace, started: str, floor: tuple[float, float]) -> str:
    lines = [
        "# Waiting for nvidia.com/gpu capacity: the module against the usual peers",
        "",
        f"Command: `.venv/bin/python bench/wait_capacity.py --sizes {' '.join(map(str, args.sizes))}"
        f" --delay {args.delay} --spread {args.spread}"
        f"{' --waiters ' + ' '.join(args.waiters) if args.waiters != WAITERS else ''}"
        f"{f' --throttle {args.throttle} --retry-after {args.retry_after}' if args.throttle else ''}`",
        f"Machine: {platform.node()} ({os.cpu_count()} CPUs, {platform.platform()}),"
        f" Python {platform.python_version()}; run {started}.",
        "The simulated API server runs in the benchmark's own process, on the same cores as the waiters.",
        f"Capacity appears {args.delay}s after the DaemonSet's pods are scheduled,"
        f" spread over {args.spread}s across nodes.",
        "",
        "| nodes | waiter | result | detection after last capacity (s) | API requests | CPU (s) | peak RSS (MiB)"
        " | wall (s) |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        status = "ok" if r.ok else f"FAILED {r.note}".strip()
        lines.append(
            f"| {r.nodes} | {r.waiter} | {status} | {r.latency_s:.2f} | {r.requests} | {r.cpu_s:.2f} |"
            f" {r.peak_rss_mib:.0f} | {r.wall_s:.1f} |"
        )
    if args.throttle:
        lines += [
            "",
            f"Throttled: {args.throttle:.0%} of all requests answered 429 with `Retry-After: {args.retry_after}`"
            " from the waiter's start until the last node has its capacity (the throttled window).",
            "",
            "| nodes | waiter | requests/s in the window | 429 answers | node lists in the window"
            " | shortest gap between node lists (s) |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for r in results:
            gap = "—" if r.min_list_gap_s is None else f"{r.min_list_gap_s:.2f}"
            lines.append(
                f"| {r.nodes} | {r.waiter} | {r.throttled_rps:.2f} | {r.throttled_429} | {r.throttled_lists} | {gap} |"
            )
    lines += [
        "",
        "Detection: from the moment the simulator set the last node's capacity to the waiter's exit (process exit"
        " included). Requests: every HTTP request the simulator answered during the waiter's run (the peers' DaemonSet"
        " was applied before, and is not counted). CPU and peak RSS: the waiter's whole process tree"
        " (GNU time; peak RSS is that of its largest process).",
        "",
        f"Floor: ansible-playbook running one ping task takes {floor[0]:.2f} s CPU and {floor[1]:.0f} MiB (best of 3,"
        " measured the same way): the module and k8s_info rows include it, kubectl (one Go binary) does not."
        " The module's requests include its own server-side apply of the DaemonSet.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--waiters", nargs="+", default=WAITERS)
    parser.add_argument("--throttle", type=float, default=0.0, help="share of requests answered 429 (0 to 1)")
    parser.add_argument("--retry-after", type=int, default=1, help="Retry-After of the 429 answers, in seconds")
    parser.add_argument("--delay", type=float, default=6.0)
    parser.add_argument("--spread", type=float, default=3.0)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--logs", type=Path, help="keep each run's output in this folder")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = []
    with tempfile.TemporaryDirectory(prefix="kubegpu-bench-") as tmp:
        work = args.logs or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for size in args.sizes:
            for waiter in args.waiters:
                result = run_one(waiter, size, work, args.delay, args.spread, args.throttle, args.retry_after)
                print(result, flush=True)
                results.append(result)
        floor = measure_floor(work)
    table = render(results, args, started, floor)
    print(table)
    if args.output:
        args.output.write_text(table)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

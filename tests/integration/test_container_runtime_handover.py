"""kubegpu.node.container_runtime: the preflight's hand-over to the role's next run on the host (site.yml's batch).

site.yml runs the role's preflight entry point on every host in its preflight play, then the role in the host's batch,
and again inside a drain window when a restart was held back. The batch run takes over what the preflight found (the
installed runtimes, the runtimes to configure) and does not search for them again; it still repeats the checks
(nvidia-container-runtime is installed by the toolkit step in between). The hand-over is used once, and only with the
inputs it was made from.

The host is this machine (local connection). The role must not configure it: the runtime binaries the role looks for
are renamed (extra vars) to stand-ins in the test's folder or to names that exist nowhere, and the runs either have no
runtime to configure (state absent) or stop at the checks, before any runtime's tasks.
"""

from __future__ import annotations

import json
import os
import re

import yaml

CHECKS = "Find the installed container runtimes, decide which to configure, and check them and nvidia-container-runtime"
# The node layer's first task: a run of the role that did not take the preflight's findings over runs it first.
NODE_LAYER = "Check the node's Python, read its facts and find its system's variables (once a run)"
# A task after each run of the role: whether that run's checks searched the node for the runtimes.
SEARCHED = "searched={}"


def _playbook(ansible, plays: list[dict]) -> str:
    path = ansible.workdir / "handover.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return str(path)


def _play(name: str, tasks_from: str | None = None, runs: int = 1, **variables) -> dict:
    role = {"name": "kubegpu.node.container_runtime"}
    if tasks_from:
        role["tasks_from"] = tasks_from
    tasks: list[dict] = []
    for n in range(runs):
        tasks.append({"name": f"{name} {n + 1}", "ansible.builtin.include_role": role})
        searched = "{{ __container_runtime_found.searched }}"
        tasks.append({"name": f"{name} {n + 1} {SEARCHED.format(searched)}", "ansible.builtin.debug": {"msg": "x"}})
    return {"name": name, "hosts": "gpu_nodes", "gather_facts": False, "vars": variables, "tasks": tasks}


def _run(ansible, plays: list[dict], binaries: dict[str, str], bin_dir=None):
    inventory = ansible.inventory({"node-a": {}})
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"} if bin_dir else None
    extra = json.dumps({"__container_runtime_binaries": binaries})
    return ansible.playbook(
        _playbook(ansible, plays), "-e", extra, inventory=inventory, env=env, skip_chain=False, timeout=240
    )


def _tasks_per_play(output: str) -> dict[str, list[str]]:
    """The task names each play ran (or skipped) for the host, in order, keyed by play name."""
    plays: dict[str, list[str]] = {}
    current: list[str] = []
    for line in output.splitlines():
        play = re.match(r"PLAY \[(.*)\] \*+", line)
        if play:
            current = plays.setdefault(play.group(1), [])
            continue
        task = re.match(r"TASK \[(?:[\w.]+ : )?(.*?)\] \*+", line)
        if task:
            current.append(task.group(1))
    return plays


def _searches(tasks: list[str]) -> list[bool]:
    """Whether each run of the role in a play searched the node for the runtimes, in order."""
    return [task.endswith(SEARCHED.format(True)) for task in tasks if " searched=" in task]


def _host_tasks(output: str, play: str) -> int:
    """How many host-task results node-a had in one play (ok, changed, skipping, failed), the role's tasks only (not
    this test's note of whether a run searched; an include's "included:" line is no result either)."""
    section = output.split(f"PLAY [{play}]", 1)[1].split("PLAY ", 1)[0]
    count, own = 0, True
    for line in section.splitlines():
        task = re.match(r"TASK \[(.*)\] \*+", line)
        if task:
            own = " searched=" not in task.group(1)
        elif own and re.match(r"(?:ok|changed|skipping|fatal): \[node-a\]", line):
            count += 1
    return count


NO_RUNTIME = {
    "docker": "kubegpu-test-no-dockerd",
    "containerd": "kubegpu-test-no-containerd",
    "cri-o": "kubegpu-no-crio",
}


def test_batch_run_takes_over_the_preflight_once(ansible):
    """The batch run after the preflight does not search again; the drain window's run (the second) does."""
    plays = [
        _play("preflight", tasks_from="preflight", container_runtime_state="absent"),
        _play("batch", runs=2, container_runtime_state="absent"),
    ]
    run = _run(ansible, plays, NO_RUNTIME)
    assert run.returncode == 0, run.output
    assert run.unchanged(["node-a"]) == []
    tasks = _tasks_per_play(run.output)
    assert _searches(tasks["preflight"]) == [True], tasks
    # The second run searches: the first took the hand-over, and spent it.
    assert _searches(tasks["batch"]) == [False, True], tasks
    # Only the second includes the node layer, which the preflight ran for the first.
    assert tasks["batch"].count(NODE_LAYER) == 1 and tasks["batch"].index("batch 2") < tasks["batch"].index(NODE_LAYER)
    # Both runs repeat the checks.
    assert tasks["batch"].count(CHECKS) == 2, tasks


def test_role_alone_searches_every_time(ansible):
    run = _run(ansible, [_play("alone", runs=2, container_runtime_state="absent")], NO_RUNTIME)
    assert run.returncode == 0, run.output
    tasks = _tasks_per_play(run.output)["alone"]
    assert _searches(tasks) == [True, True], run.output
    assert tasks.count(NODE_LAYER) == 2, run.output


def test_batch_run_after_the_preflight_pays_fewer_host_tasks(ansible):
    plays = [
        _play("preflight", tasks_from="preflight", container_runtime_state="absent"),
        _play("batch", container_runtime_state="absent"),
        _play("alone", container_runtime_state="absent"),
    ]
    run = _run(ansible, plays, NO_RUNTIME)
    assert run.returncode == 0, run.output
    batch, alone = _host_tasks(run.output, "batch"), _host_tasks(run.output, "alone")
    # The batch run: argument specs, the checks, the list, the runtimes' include (skipped: nothing to configure); before
    # the checks were one action, the stat (skipped on absent) and the assert took the checks' place (5). Alone: the
    # node layer's three tasks more (the node's Python, facts and OS variables; the renamed variables).
    assert batch == 4, run.output
    assert alone == batch + 3, run.output


def test_hand_over_made_from_other_inputs_is_not_used(ansible):
    """A run asking for other runtimes than the preflight decided for searches again (and refuses docker here)."""
    plays = [
        _play("preflight", tasks_from="preflight", container_runtime_state="absent"),
        _play("batch", container_runtime_state="absent", container_runtime_engines=["docker"]),
    ]
    run = _run(ansible, plays, NO_RUNTIME)
    assert run.returncode != 0, run.output
    assert _tasks_per_play(run.output)["batch"].count(NODE_LAYER) == 1, run.output
    assert "container_runtime_engines names docker, which is not installed on node-a (installed: none)" in run.output


def test_batch_run_checks_nvidia_container_runtime_again(ansible, tmp_path):
    """The preflight did not require nvidia-container-runtime (the toolkit step installs it later); the batch run
    does, and stops before any runtime's tasks when it is missing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    standin = bin_dir / "kubegpu-test-containerd"
    standin.write_text("#!/bin/sh\necho 'stand-in: must not run' >&2\nexit 3\n")
    standin.chmod(0o755)
    binaries = {**NO_RUNTIME, "containerd": standin.name}
    missing = str(tmp_path / "nvidia-container-runtime")
    common = {"container_runtime_engines": ["containerd"], "container_runtime_nvidia_runtime_path": missing}
    plays = [
        _play("preflight", tasks_from="preflight", container_runtime_require_nvidia_runtime=False, **common),
        _play("batch", **common),
    ]
    run = _run(ansible, plays, binaries, bin_dir=bin_dir)
    assert run.returncode != 0, run.output
    tasks = _tasks_per_play(run.output)
    assert tasks["batch"].count(NODE_LAYER) == 0 and tasks["batch"].count(CHECKS) == 1, tasks
    assert f"{missing} does not exist or is not executable on node-a" in run.output
    assert "Install the NVIDIA Container Toolkit first" in run.output
    assert "Work out containerd's configuration" not in run.output
    assert "stand-in: must not run" not in run.output

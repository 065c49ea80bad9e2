# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The decisions of kubegpu.node.service_config: what differs, what a write and a restore set, what the message says."""

from __future__ import annotations

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _service_config as sc

REGULAR = {
    "exists": True,
    "isreg": True,
    "islnk": False,
    "checksum": sc.sha1("a = 1\n"),
    "mode": "0640",
    "pw_name": "root",
    "gr_name": "docker",
}


def test_regular_file_same_content_is_unchanged():
    state = sc.file_state("/etc/x.conf", REGULAR, None)
    change = sc.plan_change({"path": "/etc/x.conf", "content": "a = 1\n"}, state)
    assert not change.changed
    assert state.real_path == "/etc/x.conf"


def test_content_difference_is_a_change_and_attributes_kept_when_not_asked():
    state = sc.file_state("/etc/x.conf", REGULAR, None)
    change = sc.plan_change({"path": "/etc/x.conf", "content": "a = 2\n"}, state)
    assert change.content_differs
    assert change.attributes_differ == []
    # An existing file keeps its mode and owner when none is asked for.
    assert sc.write_attributes(change) == {}


def test_mode_asked_for_is_a_change_even_with_the_same_content():
    state = sc.file_state("/etc/x.conf", REGULAR, None)
    change = sc.plan_change({"path": "/etc/x.conf", "content": "a = 1\n", "mode": "600"}, state)
    assert change.changed and not change.content_differs
    assert change.attributes_differ == ["mode"]
    assert sc.write_attributes(change) == {"mode": "0600"}


def test_new_file_is_roots_and_0644_unless_asked():
    state = sc.file_state("/etc/new.conf", {"exists": False}, None)
    change = sc.plan_change({"path": "/etc/new.conf", "content": "x"}, state)
    assert change.changed
    assert sc.write_attributes(change) == {"mode": "0644", "owner": "root", "group": "root"}
    change = sc.plan_change({"path": "/etc/new.conf", "content": "x", "mode": 0o600}, state)
    assert sc.write_attributes(change)["mode"] == "0600"


def test_removal_of_a_missing_file_is_no_change():
    state = sc.file_state("/etc/gone.conf", {"exists": False}, None)
    assert not sc.plan_change({"path": "/etc/gone.conf", "content": None}, state).changed
    state = sc.file_state("/etc/x.conf", REGULAR, None)
    assert sc.plan_change({"path": "/etc/x.conf", "content": None}, state).changed


def test_link_is_managed_through_its_target_and_restored_with_the_targets_attributes():
    link = {"exists": True, "islnk": True, "lnk_source": "/srv/conf/x.conf"}
    state = sc.file_state("/etc/x.conf", link, REGULAR)
    assert state.is_link and state.real_path == "/srv/conf/x.conf" and state.exists
    assert sc.restore_attributes(state) == {"mode": "0640", "owner": "root", "group": "docker"}


def test_dangling_link_writes_its_target():
    link = {"exists": True, "islnk": True, "lnk_source": "/srv/conf/missing.conf"}
    state = sc.file_state("/etc/x.conf", link, {"exists": False})
    assert state.is_link and not state.exists
    assert sc.plan_change({"path": "/etc/x.conf", "content": "{}"}, state).changed


@pytest.mark.parametrize(
    ("stat", "message"),
    [
        ({"exists": True, "isreg": False, "isdir": True}, "is a directory"),
        ({"exists": True, "isreg": False, "isdir": False}, "is not a regular file"),
    ],
)
def test_not_a_regular_file_is_refused(stat, message):
    with pytest.raises(sc.PlanError, match=message):
        sc.file_state("/etc/x.conf", stat, None)


@pytest.mark.parametrize("mode", ["u+rw", "999", "07777x", True, -1])
def test_bad_modes_are_refused(mode):
    with pytest.raises(sc.PlanError, match="octal"):
        sc.normal_mode(mode, "/etc/x")


def test_backup_names_are_flat():
    assert sc.backup_name("/etc/docker/daemon.json", "20261122T000000Z") == "etc_docker_daemon.json.20261122T000000Z"


@pytest.mark.parametrize(
    ("journal", "expected"),
    [
        (
            'time="2026-11-22" level=info msg="Starting up"\n'
            "unable to configure the Docker daemon with file /etc/docker/daemon.json: invalid character\n"
            'time="2026-11-22" level=info msg="bye"\n',
            "unable to configure the Docker daemon with file /etc/docker/daemon.json: invalid character",
        ),
        ('level=fatal msg="failed to load TOML"', 'level=fatal msg="failed to load TOML"'),
        (
            'E1122 10:00:00.000 1 run.go:72] command failed err="unrecognized feature gate: DevicePlugins"',
            'E1122 10:00:00.000 1 run.go:72] command failed err="unrecognized feature gate: DevicePlugins"',
        ),
        ("all is   well\nstarted", None),
    ],
)
def test_daemon_error_is_the_last_error_line(journal, expected):
    assert sc.daemon_error(journal) == expected


def test_messages_tell_the_start_limit_from_the_daemon_refusing():
    refused = sc.restart_failure_message("docker.service", "exit-code", "invalid character 'N'", "", True, True)
    assert "did not come back with the new configuration: invalid character 'N'" in refused
    assert "running with them again" in refused
    limited = sc.restart_failure_message("docker.service", "start-limit-hit", None, "", True, True)
    assert "start limit was hit" in limited and "not necessarily the new configuration" in limited
    down = sc.restart_failure_message("kubelet.service", "exit-code", None, "timed out", True, False)
    assert "it is down" in down and "timed out" in down


def entry(real_path: str, backup: str | None) -> dict:
    return {"path": real_path, "real_path": real_path, "backup": backup, "attributes": None, "created_dirs": []}


def test_a_file_changed_again_while_its_restart_is_held_back_restores_the_first_state():
    earlier = [entry("/etc/a", "/b/a.1"), entry("/etc/b", None)]
    now = [entry("/etc/a", "/b/a.2"), entry("/etc/c", "/b/c.2")]
    merged = sc.merge_restore_entries(earlier, now)
    assert [(e["real_path"], e["backup"]) for e in merged] == [
        ("/etc/a", "/b/a.1"),
        ("/etc/b", None),
        ("/etc/c", "/b/c.2"),
    ]


@pytest.mark.parametrize(
    ("marker", "boot_id", "started", "pending"),
    [
        ({"boot_id": "b1", "written_us": 500}, "b1", 400, True),  # the unit started before the change was written
        ({"boot_id": "b1", "written_us": 500}, "b1", 600, False),  # restarted since: the change is active
        ({"boot_id": "b1", "written_us": 500}, "b2", 100, False),  # rebooted since
        ({"boot_id": "b1", "written_us": 500}, "b1", None, True),  # the unit does not run
        ({"boot_id": "b1", "written_us": "x"}, "b1", 1, False),
        (None, "b1", 1, False),
    ],
)
def test_a_held_back_change_is_pending_until_the_unit_restarts(marker, boot_id, started, pending):
    assert sc.pending_is_current(marker, boot_id, started) is pending


def test_markers_that_cannot_be_read_count_as_none():
    assert sc.parse_marker(None) is None
    assert sc.parse_marker("{") is None
    assert sc.parse_marker('{"restore": 1}') is None
    assert sc.parse_marker('{"restore": [], "boot_id": "x"}') == {"restore": [], "boot_id": "x"}


def test_uptime_in_microseconds():
    assert sc.uptime_us("12.5 40.0\n") == 12_500_000


# --- systemctl daemon-reload and running GPU containers (NVIDIA/nvidia-docker#1730) ---------------------------------

# What GPU_PROBE_SCRIPT prints on a node with two GPUs, nvidia-uvm and one MIG capability device: a CUDA process in a
# container holds nvidia0, nvidiactl and nvidia-uvm; nvidia-persistenced holds every GPU.
PROBE_OUTPUT = (
    "device\t/dev/nvidia0\t195:0\t1\n"
    "device\t/dev/nvidia1\t195:1\t1\n"
    "device\t/dev/nvidia-uvm\t508:0\t0\n"
    "device\t/dev/nvidiactl\t195:255\t1\n"
    "device\t/dev/nvidia-caps/nvidia-cap1\t511:1\t0\n"
    "open\t4242\t/dev/nvidiactl\t/usr/bin/python3.11\tpython3\n"
    "open\t4242\t/dev/nvidia0\t/usr/bin/python3.11\tpython3\n"
    "open\t4242\t/dev/nvidia-uvm\t/usr/bin/python3.11\tpython3\n"
    "open\t4242\t/dev/nvidia0\t/usr/bin/python3.11\tpython3\n"
    "open\t812\t/dev/nvidia0\t/usr/bin/nvidia-persistenced\tnvidia-persiste\n"
    "open\t812\t/dev/nvidia1\t/usr/bin/nvidia-persistenced\tnvidia-persiste\n"
)


def test_gpu_probe_lists_devices_links_and_holders():
    probe = sc.parse_gpu_probe(PROBE_OUTPUT)
    assert [d.path for d in probe.devices] == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia-uvm",
        "/dev/nvidiactl",
        "/dev/nvidia-caps/nvidia-cap1",
    ]
    assert probe.unlinked == ["/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1"]
    # One entry per process, each device once; NVIDIA's persistence daemon is no workload.
    assert probe.processes == (
        sc.GpuProcess(pid=4242, command="python3", devices=("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm")),
    )


@pytest.mark.parametrize(
    "line",
    [
        "open\t900\t/dev/nvidia0\t/usr/bin/nvidia-persistenced (deleted)\tnvidia-persiste",  # upgraded under it
        "open\t901\t/dev/nvidia0\t/usr/bin/nv-fabricmanager\tnv-fabricmanage",
        "open\tx\t/dev/nvidia0\t/usr/bin/sleep\tsleep",  # not a process number
        "open\t902",  # cut short
        "something else",
    ],
)
def test_gpu_probe_ignores_host_daemons_and_lines_it_cannot_read(line):
    assert sc.parse_gpu_probe(line + "\n").processes == ()


def test_gpu_probe_names_a_process_by_its_executable_when_it_has_no_name():
    probe = sc.parse_gpu_probe("open\t7\t/dev/nvidia0\t/opt/app/bin/train\t\n")
    assert probe.processes[0].command == "train"


def test_reload_is_held_back_when_links_are_missing_and_a_process_holds_a_gpu():
    decision = sc.daemon_reload_decision(sc.parse_gpu_probe(PROBE_OUTPUT), drained=False)
    assert not decision.allowed
    assert decision.unlinked == ("/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1")
    assert [p.pid for p in decision.processes] == [4242]
    assert decision.as_result() == {
        "held_back": True,
        "drained": False,
        "unlinked": ["/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1"],
        "processes": [
            {"pid": 4242, "command": "python3", "devices": ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"]}
        ],
    }


def test_reload_is_allowed_inside_a_drain_window_without_reading_the_node():
    assert sc.daemon_reload_decision(sc.parse_gpu_probe(PROBE_OUTPUT), drained=True).allowed
    decision = sc.daemon_reload_decision(None, drained=True)
    assert decision.allowed
    assert decision.as_result() == {"held_back": False, "drained": True, "unlinked": [], "processes": []}


def test_reload_is_allowed_when_every_device_is_linked():
    linked = PROBE_OUTPUT.replace("508:0\t0", "508:0\t1").replace("511:1\t0", "511:1\t1")
    decision = sc.daemon_reload_decision(sc.parse_gpu_probe(linked), drained=False)
    assert decision.allowed
    assert decision.unlinked == ()
    assert [p.pid for p in decision.processes] == [4242]


def test_reload_is_allowed_when_no_workload_holds_a_gpu():
    # Links missing, but only NVIDIA's persistence daemon holds the devices: nothing to take a GPU away from.
    idle = "".join(line + "\n" for line in PROBE_OUTPUT.splitlines() if "python3" not in line)
    decision = sc.daemon_reload_decision(sc.parse_gpu_probe(idle), drained=False)
    assert decision.allowed
    assert decision.unlinked == ("/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1")


def test_reload_is_allowed_on_a_node_without_nvidia_devices():
    assert sc.daemon_reload_decision(sc.parse_gpu_probe(""), drained=False).allowed


def test_held_back_reload_warning_names_the_processes_devices_and_both_ways_out():
    processes = tuple(sc.GpuProcess(pid=100 + n, command=f"job{n}", devices=("/dev/nvidia0",)) for n in range(7))
    decision = sc.ReloadDecision(allowed=False, unlinked=("/dev/nvidia0", "/dev/nvidiactl"), processes=processes)
    message = sc.daemon_reload_warning("containerd.service", decision)
    assert message.startswith("containerd.service was not restarted")
    assert "job0 (pid 100)" in message and "job4 (pid 104)" in message and "job5" not in message
    assert "2 more" in message
    assert "/dev/nvidia0, /dev/nvidiactl" in message
    assert "kubegpu.node.nvidia_container_toolkit" in message
    assert "drained: true" in message
    assert "NVIDIA/nvidia-docker#1730" in message

# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The decisions of kubegpu.node.service_config: what differs, what a write and a restore set, what the message says."""

from __future__ import annotations

import json
from pathlib import Path

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


# --- the note of a change, and whether its files are back as they were --------------------------------------------


def test_a_restore_entry_keeps_what_the_file_was():
    state = sc.file_state("/etc/x.conf", REGULAR, None)
    change = sc.plan_change({"path": "/etc/x.conf", "content": "a = 2\n"}, state)
    kept = sc.restore_entry(change, "/b/x.1", [])
    assert kept["existed"] and kept["checksum"] == sc.sha1("a = 1\n")
    assert kept["attributes"] == {"mode": "0640", "owner": "root", "group": "docker"}
    new = sc.plan_change({"path": "/etc/new", "content": "x"}, sc.file_state("/etc/new", {"exists": False}, None))
    assert sc.restore_entry(new, None, ["/etc"]) | {"created_dirs": []} == {
        "path": "/etc/new",
        "real_path": "/etc/new",
        "backup": None,
        "attributes": None,
        "created_dirs": [],
        "existed": False,
        "checksum": None,
    }


def _noted(path: str, content: str | None) -> dict:
    """The note's entry for a file that held `content` (None: did not exist) before the noted change."""
    stat = {**REGULAR, "checksum": sc.sha1(content)} if content is not None else {"exists": False}
    state = sc.file_state(path, stat, None)
    return sc.restore_entry(
        sc.plan_change({"path": path, "content": "changed"}, state), "/b/x" if content else None, []
    )


def _after(path: str, content: str | None, spec: dict | None = None) -> sc.Planned:
    stat = {**REGULAR, "checksum": sc.sha1(content)} if content is not None else {"exists": False}
    return sc.planned_state(sc.plan_change(spec or {"path": path, "content": content}, sc.file_state(path, stat, None)))


def test_a_note_is_moot_when_every_file_ends_as_it_was_before_the_noted_change():
    entries = [_noted("/etc/main", "a = 1\n"), _noted("/etc/dropin", None)]
    # The run that follows a cut change puts both back (state absent): nothing differs from what the service runs.
    back = {"/etc/main": _after("/etc/main", "a = 1\n"), "/etc/dropin": _after("/etc/dropin", None)}
    assert sc.back_as_before(entries, back)
    # The drop-in stays written: the service has not read it yet.
    written = {**back, "/etc/dropin": _after("/etc/dropin", "nvidia")}
    assert not sc.back_as_before(entries, written)
    # The same bytes with another mode are not the file the service read.
    moded = {
        **back,
        "/etc/main": _after("/etc/main", "a = 1\n", {"path": "/etc/main", "content": "a = 1\n", "mode": "0600"}),
    }
    assert not sc.back_as_before(entries, moded)
    # A file this run does not know, or a note of an older version that did not keep what the file was: not moot.
    assert not sc.back_as_before(entries, {"/etc/main": back["/etc/main"]})
    older = [{key: value for key, value in entry.items() if key not in ("existed", "checksum")} for entry in entries]
    assert not sc.back_as_before(older, back)


@pytest.mark.parametrize(
    "restore",
    [
        [1],
        [{"path": "/etc/a", "real_path": "/etc/a", "backup": "/b/a", "attributes": None, "created_dirs": []}],
        [{"path": "/etc/a", "real_path": "/etc/a", "backup": None, "attributes": None, "created_dirs": "/etc"}],
        [{"path": "/etc/a", "backup": None, "attributes": None, "created_dirs": []}],
    ],
)
def test_a_note_whose_way_back_cannot_be_read_counts_as_none(restore):
    assert sc.parse_marker(json.dumps({"restore": restore, "boot_id": "b", "written_us": 1})) is None


# --- the journal lines of the processes a restart started (captured on Debian 11 and 13) --------------------------

JOURNAL = Path(__file__).parent / "fixtures" / "journal"
CASES = json.loads((JOURNAL / "cases.json").read_text())
CRASH_LOOPS = sorted(name for name in CASES if name.startswith("crash_loop"))
RELOADS = sorted(name for name in CASES if name.startswith("reload"))


def _case(name: str) -> tuple[str, dict, sc.RestartMark]:
    case = CASES[name]
    return (JOURNAL / name).read_text(), case, sc.RestartMark(cursor="s=...", invocation=case["before"])


@pytest.mark.parametrize("name", CRASH_LOOPS)
def test_a_crash_loop_of_the_previous_process_is_not_the_new_configurations_error(name):
    journal, case, mark = _case(name)
    entries = sc.journal_entries(journal)
    # What reading every line of the unit since the mark would quote: the old process's crash loop.
    everything = "\n".join(sc.lines_of(entries, case["unit"], None))
    assert "old configuration" in sc.daemon_error(everything)
    # The processes the restart started logged no error of their own: nothing is quoted.
    assert sc.new_process_error(journal, case["unit"], mark, case["after"], reloaded=False) is None
    started = sc.started_invocations(entries, case["before"], case["after"])
    assert case["after"] in started and case["before"] not in started
    new_lines = sc.lines_of(entries, case["unit"], started)
    assert new_lines and set(new_lines) == {"reading /etc/demo/new"}
    # With a pattern that matches them, their own line is what is quoted.
    quoted = sc.new_process_error(journal, case["unit"], mark, case["after"], reloaded=False, pattern="reading")
    assert quoted == "reading /etc/demo/new"


def test_the_process_an_automatic_restart_started_before_the_restart_is_not_the_restarts():
    # trixie: the crash loop's last automatic restart (the "before" ID) had already read the new file.
    journal, case, _mark = _case("crash_loop_then_restart.trixie.json")
    entries = sc.journal_entries(journal)
    assert sc.lines_of(entries, case["unit"], {case["before"]}) == ["reading /etc/demo/new"]
    started = sc.started_invocations(entries, case["before"], case["after"])
    # The restart's invocation and those systemd started after it (Restart=), in the order PID 1 logged them.
    order = [e["INVOCATION_ID"] for e in entries if e["_PID"] == "1" and e["MESSAGE"] == "Started demo.service."]
    assert order.index(case["before"]) < order.index(case["after"])
    assert started == set(order[order.index(case["after"]) :])


@pytest.mark.parametrize("name", CRASH_LOOPS)
def test_a_restart_refused_by_the_start_limit_started_no_process_to_quote(name):
    journal, case, mark = _case(name)
    # The invocation ID did not change: systemd started nothing, so nothing in the journal is the new configuration's.
    assert sc.new_process_error(journal, case["unit"], mark, case["before"], reloaded=False, pattern=".") is None
    assert sc.new_process_error(journal, case["unit"], mark, "", reloaded=False, pattern=".") is None


@pytest.mark.parametrize("name", RELOADS)
def test_after_a_reload_the_same_process_lines_since_the_mark_count(name):
    journal, case, mark = _case(name)
    error = sc.new_process_error(journal, case["unit"], mark, case["after"], reloaded=True)
    assert error == 'level=error msg="reload refused: new"'


def test_a_line_the_journal_did_not_attribute_counts_by_its_process():
    entries = [
        {"_PID": "1", "INVOCATION_ID": "old", "MESSAGE": "Stopping x.service..."},
        {"_PID": "10", "_SYSTEMD_UNIT": "x.service", "MESSAGE": "level=fatal msg=old"},  # unattributed, old process
        {"_PID": "1", "INVOCATION_ID": "new", "MESSAGE": "Started x.service."},
        {"_PID": "20", "_SYSTEMD_UNIT": "x.service", "_SYSTEMD_INVOCATION_ID": "new", "MESSAGE": "starting"},
        {"_PID": "20", "_SYSTEMD_UNIT": "x.service", "MESSAGE": [108, 101, 118, 101, 108, 61, 102, 97, 116, 97, 108]},
        {"_PID": "1", "INVOCATION_ID": "later", "MESSAGE": "Started x.service."},
        {"_PID": "30", "_SYSTEMD_UNIT": "x.service", "_SYSTEMD_INVOCATION_ID": "later", "MESSAGE": "error: again"},
        "not an entry",
    ]
    text = "\n".join(json.dumps(entry) for entry in entries) + "\nnot json\n"
    parsed = sc.journal_entries(text)
    assert sc.started_invocations(parsed, "old", "new") == {"new", "later"}
    # PID 20's line without an invocation is PID 20's invocation's; PID 10's cannot be placed and is left out. A
    # message that is not UTF-8 comes as a list of bytes.
    assert sc.lines_of(parsed, "x.service", {"new"}) == ["starting", "level=fatal"]
    assert sc.new_process_error(text, "x.service", sc.RestartMark("c", "old"), "new", reloaded=False) == "error: again"


def test_the_one_line_of_a_main_process_that_exited_before_journald_placed_it_counts_by_its_pid():
    # Seen on Debian 13 under load (CI, 2026-11-28): CRI-O's stand-in logged one fatal line and exited; journald read
    # the stream after the process's cgroup was gone, so the entry has the unit (from the stream) but no invocation.
    entries = [
        {"_PID": "1", "INVOCATION_ID": "old", "MESSAGE": "Stopping x.service..."},
        {"_PID": "10", "_SYSTEMD_UNIT": "x.service", "MESSAGE": "level=fatal msg=old"},  # the old process, unplaced
        {"_PID": "1", "INVOCATION_ID": "new", "MESSAGE": "Starting x.service..."},
        {"_PID": "20", "_SYSTEMD_UNIT": "x.service", "MESSAGE": 'level=fatal msg="runtime nvidia: not executable"'},
        {"_PID": "1", "INVOCATION_ID": "new", "MESSAGE": "x.service: Main process exited, code=exited"},
    ]
    text = "\n".join(json.dumps(entry) for entry in entries)
    mark = sc.RestartMark("c", "old")
    # Without the main PID the line cannot be placed and nothing is quoted (what the role said on that run).
    assert sc.new_process_error(text, "x.service", mark, "new", reloaded=False) is None
    quoted = sc.new_process_error(text, "x.service", mark, "new", reloaded=False, main_pid="20")
    assert quoted == 'level=fatal msg="runtime nvidia: not executable"'
    # The old process's unplaced line is not the new main process's.
    assert sc.new_process_error(text, "x.service", mark, "new", reloaded=False, main_pid="20", pattern="old") is None
    # A restart that started nothing (start limit) quotes nothing, whatever the main PID.
    assert sc.new_process_error(text, "x.service", mark, "old", reloaded=False, main_pid="10") is None


@pytest.mark.parametrize(
    ("output", "mark"),
    [
        ("s=1;i=2\n\nabc\n", sc.RestartMark("s=1;i=2", "abc")),
        ("\nabc\n", sc.RestartMark("", "abc")),
        ("s=1;i=2\n\n\n", sc.RestartMark("s=1;i=2", "")),
        ("", sc.RestartMark("", "")),
    ],
)
def test_the_mark_before_a_restart(output, mark):
    assert sc.parse_restart_mark(output) == mark

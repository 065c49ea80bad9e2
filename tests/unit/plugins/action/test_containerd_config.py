"""Tests of kubegpu.node.containerd_config's planner against files in a temporary folder, through the action's own
Node (_containerd_node.SnapshotNode) whose script runs in this machine's sh (the action runs it over the connection).

containerd itself is a STAND-IN here (a small Python script, see tests/README.md): it prints a fixed default
configuration and merges imports key by key, as containerd 2.x does. The molecule scenario `containerd` runs the
action against the real containerd 1.4, 1.6, 1.7 and 2.1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib
from ansible_collections.kubegpu.node.plugins.action.containerd_config import ActionModule
from ansible_collections.kubegpu.node.plugins.plugin_utils import _containerd_config as cc
from ansible_collections.kubegpu.node.plugins.plugin_utils import _containerd_node as cn

COLLECTIONS = Path(__file__).resolve().parents[4] / ".tmp" / "collections"
NVIDIA = "/usr/bin/nvidia-container-runtime"

FAKE_CONTAINERD = textwrap.dedent(
    """\
    #!{python}
    # STAND-IN for containerd: `config default` and `--config FILE config dump`. Imports are loaded as containerd loads
    # them (relative ones against the folder of the file that names them, nested ones once). Version 3 is containerd
    # 2.x, which merges them key by key; version 2 is containerd 1.x, where the last file that sets a plugin's section
    # replaces it whole (what the files set then goes over the defaults key by key).
    import os, sys, tomllib
    sys.path.insert(0, {collections!r})
    from ansible_collections.kubegpu.node.plugins.plugin_utils._containerd_config import dumps

    VERSION = {version}
    PLUGIN = 'io.containerd.cri.v1.runtime' if VERSION == 3 else 'io.containerd.grpc.v1.cri'
    DEFAULT = f'''version = {{VERSION}}
    imports = []

    [plugins.'{{PLUGIN}}']
      enable_cdi = true
      [plugins.'{{PLUGIN}}'.containerd]
        default_runtime_name = 'runc'
        [plugins.'{{PLUGIN}}'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'{{PLUGIN}}'.containerd.runtimes.runc.options]
            SystemdCgroup = false
    '''

    def merge(into, new, whole_sections=False, depth=0):
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict) and not (whole_sections and depth == 1):
                merge(into[key], value, whole_sections, depth + 1)
            else:
                into[key] = value

    args = sys.argv[1:]
    if args == ["config", "default"]:
        print(DEFAULT, end="")
        sys.exit(0)
    assert args[0] == "--config" and args[2:] == ["config", "dump"], args
    files = {{}}
    pending, loaded = [args[1]], []
    while pending:
        path = pending.pop(0)
        if path in loaded:
            continue
        loaded.append(path)
        doc = tomllib.load(open(path, "rb"))
        pending += [os.path.join(os.path.dirname(path), entry) for entry in doc.pop("imports", [])]
        merge(files, {{key: value for key, value in doc.items() if key != "version"}}, VERSION == 2)
    merged = tomllib.loads(DEFAULT)
    merge(merged, files)
    merged["version"] = VERSION
    print(dumps(merged), end="")
    """
)


def containerd(folder: Path, version: int = 3) -> Path:
    """The stand-in, as `folder`/containerd."""
    binary = folder / "containerd"
    binary.write_text(FAKE_CONTAINERD.format(python=sys.executable, collections=str(COLLECTIONS), version=version))
    binary.chmod(0o755)
    return binary


@pytest.fixture
def host(tmp_path):
    containerd(tmp_path)
    etc = tmp_path / "etc"
    etc.mkdir()
    return tmp_path


def local(argv: list[str]) -> dict:
    """NodeAction.command on this machine."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


DEFAULTS = {
    "state": "present",
    "runtime_name": "nvidia",
    "runtime_path": NVIDIA,
    "systemd_cgroup": None,
    "set_as_default": False,
    "cdi": False,
    "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"],
}


def run(host: Path, node: cn.SnapshotNode | None = None, **params) -> dict:
    """What the action returns: the plan, or failed and msg."""
    args = {
        **DEFAULTS,
        "path": str(host / "etc" / "config.toml"),
        "dropin": str(host / "etc" / "conf.d" / "99-nvidia.toml"),
        "record": str(host / "record.json"),
        "containerd_binary": str(host / "containerd"),
        **params,
    }
    try:
        node = node or cn.SnapshotNode(local, binary=args["containerd_binary"])
        return {"changed": False, **cc.Planner(node, args).plan()}
    except cc.ConfigError as exc:
        return {"failed": True, "msg": str(exc)}


def apply(host: Path, result: dict) -> None:
    """What the role does with the result."""
    for key, path in (("main_content", result["main_path"]), ("dropin_content", result["dropin"])):
        target = Path(path)
        if result[key] is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(result[key])
    record = host / "record.json"
    if result["record_content"] is None:
        record.unlink(missing_ok=True)
    else:
        record.write_text(result["record_content"])


def test_without_a_main_file_the_default_is_written_and_absent_removes_it_again(host):
    result = run(host, set_as_default=True)
    assert not result.get("failed"), result
    assert result["changed"] is False
    assert result["main_before"] is None
    assert result["config_version"] == 3
    main = tomllib.loads(result["main_content"])
    assert main["imports"] == [result["dropin"]]
    dropin = tomllib.loads(result["dropin_content"])
    runtime = dropin["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert runtime["default_runtime_name"] == "nvidia"
    assert runtime["runtimes"]["nvidia"]["options"] == {"BinaryName": NVIDIA, "SystemdCgroup": False}
    apply(host, result)

    again = run(host, set_as_default=True)
    assert (again["main_content"], again["dropin_content"], again["record_content"]) == (
        result["main_content"],
        result["dropin_content"],
        result["record_content"],
    )

    gone = run(host, state="absent")
    assert gone["main_content"] is None  # the role wrote it from the defaults, nobody changed it since
    assert gone["dropin_content"] is None
    assert gone["record_content"] is None


def test_the_files_come_in_the_order_service_config_writes_them_record_first_on_present_last_on_absent(host):
    result = run(host)
    apply(host, result)
    record, dropin, main = str(host / "record.json"), result["dropin"], result["main_path"]
    assert [(f["path"], f["content"]) for f in result["service_files"]] == [
        (record, result["record_content"]),
        (dropin, result["dropin_content"]),
        (main, result["main_content"]),
    ]
    # The drop-in may hold registry credentials (containerd 1.x repeats the CRI section): root's alone.
    assert result["service_files"][1]["mode"] == "0600" and result["service_files"][1]["owner"] == "root"
    gone = run(host, state="absent")
    assert [f["path"] for f in gone["service_files"]] == [main, dropin, record]
    assert [f["content"] for f in gone["service_files"]] == [None, None, None]


def test_a_users_file_gets_the_import_and_gets_it_back_byte_for_byte(host):
    user = "# mine\nversion = 3\n\n[debug]\n  level = 'warn'\n"
    (host / "etc" / "config.toml").write_text(user)
    result = run(host, systemd_cgroup=True)
    assert not result.get("failed"), result
    assert result["main_content"] == user.replace("version = 3\n", f'version = 3\nimports = ["{result["dropin"]}"]\n')
    assert "default_runtime_name" not in result["dropin_content"]
    assert result["systemd_cgroup"] is True
    apply(host, result)
    gone = run(host, state="absent")
    assert gone["main_content"] == user


def test_an_import_the_user_had_stays_after_absent(host):
    dropin = host / "etc" / "conf.d" / "99-nvidia.toml"
    user = f'version = 3\nimports = ["{host / "etc" / "conf.d"}/*.toml"]\n'
    (host / "etc" / "config.toml").write_text(user)
    result = run(host)
    assert result["main_content"] == user
    assert result["import_added"] is False
    assert json.loads(result["record_content"])["import_added"] is False
    apply(host, result)
    assert dropin.exists()
    assert run(host, state="absent")["main_content"] == user


def test_version_1_is_refused_and_nothing_is_returned_to_write(host):
    (host / "etc" / "config.toml").write_text("[plugins.cri]\n  sandbox_image = 'x'\n")
    result = run(host)
    assert result["failed"] is True
    assert "containerd config migrate" in result["msg"]
    assert "dropin_content" not in result


def test_a_broken_record_stops_with_its_name(host):
    (host / "record.json").write_text("{")
    result = run(host)
    assert result["failed"] is True
    assert "record.json is not valid JSON" in result["msg"]


def test_a_second_imports_key_is_reported_not_repaired(host):
    (host / "etc" / "config.toml").write_text("version = 3\nimports = []\nimports = []\n")
    result = run(host)
    assert result["failed"] is True
    assert "config.toml is not valid TOML" in result["msg"]


# A run with nothing to change reads the node once and dumps the base and the drop-in on disk together.
NO_OP_COMMANDS = 2


def _user_imports(host: Path) -> None:
    """containerd 1.6's case of the molecule scenario: the user imports conf.d/*.toml and sets the CRI section there."""
    conf = host / "etc" / "conf.d"
    conf.mkdir()
    (host / "etc" / "config.toml").write_text(f'version = 2\nimports = ["{conf}/*.toml"]\n')
    (conf / "50-user.toml").write_text(
        "version = 2\n[plugins.'io.containerd.grpc.v1.cri']\n  sandbox_image = 'registry.example.internal/pause'\n"
        "  [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc.options]\n    SystemdCgroup = true\n"
    )


@pytest.mark.parametrize(
    ("version", "setup", "params"),
    [
        (3, None, {}),
        (3, None, {"set_as_default": True, "cdi": True}),
        (2, None, {}),
        (2, _user_imports, {}),
    ],
    ids=[
        "2.x from the defaults",
        "2.x default runtime and CDI",
        "1.x from the defaults",
        "1.x with the user's imports",
    ],
)
def test_a_run_with_nothing_to_change_costs_two_commands(host, version, setup, params):
    containerd(host, version)
    if setup:
        setup(host)
    first = cn.SnapshotNode(local, binary=str(host / "containerd"))
    planned = run(host, node=first, **params)
    assert not planned.get("failed"), planned
    assert first.commands == 3  # read, base dump, candidate dump
    apply(host, planned)

    node = cn.SnapshotNode(local, binary=str(host / "containerd"))
    again = run(host, node=node, **params)
    assert not again.get("failed"), again
    assert node.commands <= NO_OP_COMMANDS
    assert (again["main_content"], again["dropin_content"], again["record_content"]) == (
        planned["main_content"],
        planned["dropin_content"],
        planned["record_content"],
    )
    assert (again["main_before"], again["dropin_before"]) == (again["main_content"], again["dropin_content"])
    if setup:
        # containerd 1.x: the drop-in carries the user's CRI section, read from the import in the first command.
        assert "registry.example.internal/pause" in again["dropin_content"]
        assert again["systemd_cgroup"] is True
        assert again["import_added"] is False


def test_a_changed_option_is_checked_as_its_own_candidate(host):
    planned = run(host)
    apply(host, planned)
    node = cn.SnapshotNode(local, binary=str(host / "containerd"))
    changed = run(host, node=node, systemd_cgroup=True, set_as_default=True)
    assert not changed.get("failed"), changed
    assert node.commands == 3
    runtime = tomllib.loads(changed["dropin_content"])["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert runtime["default_runtime_name"] == "nvidia"
    assert runtime["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True


def test_a_dropin_another_import_overrides_is_refused_on_a_no_op_run_too(host):
    planned = run(host, set_as_default=True)
    apply(host, planned)
    main = host / "etc" / "config.toml"
    late = host / "etc" / "zz-late.toml"
    late.write_text(
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'\n"
    )
    main.write_text(main.read_text().replace(f'"{planned["dropin"]}"]', f'"{planned["dropin"]}", "{late}"]'))
    node = cn.SnapshotNode(local, binary=str(host / "containerd"))
    refused = run(host, node=node, set_as_default=True)
    assert refused["failed"] is True
    assert "default_runtime_name is 'runc', not 'nvidia'" in refused["msg"]
    assert node.commands == NO_OP_COMMANDS


# The action itself over a stand-in connection: each command it would send over SSH runs in this machine's sh, and
# every operation that costs a round trip is recorded.


class _Shell:
    tmpdir = None


def _action(args: dict, line_end: str) -> tuple[ActionModule, list[str]]:
    task = SimpleNamespace(
        args=args, async_val=0, check_mode=False, diff=False, action="kubegpu.node.containerd_config"
    )
    connection = SimpleNamespace(_shell=_Shell())
    action = ActionModule(task, connection, SimpleNamespace(check_mode=False), None, None, None)
    trips: list[str] = []

    def execute(cmd: str, sudoable: bool = True, in_data=None) -> dict:
        trips.append(cmd)
        done = subprocess.run(cmd, shell=True, capture_output=True, text=True, check=False)
        return {"rc": done.returncode, "stdout": done.stdout.replace("\n", line_end), "stderr": done.stderr}

    def refused(*args, **kwargs):
        trips.append("temporary folder or module")
        raise AssertionError("no temporary folder, transfer or module is needed")

    action._low_level_execute_command = execute  # type: ignore[method-assign]
    action._make_tmp_path = refused  # type: ignore[method-assign]
    action._transfer_data = refused  # type: ignore[method-assign]
    action._execute_module = refused  # type: ignore[method-assign]
    return action, trips


@pytest.mark.parametrize("line_end", ["\n", "\r\n"], ids=["pipe", "terminal"])
def test_the_action_on_a_no_op_run_sends_two_commands_and_makes_no_temporary_folder(host, line_end):
    args = {
        "path": str(host / "etc" / "config.toml"),
        "dropin": str(host / "etc" / "conf.d" / "99-nvidia.toml"),
        "record": str(host / "record.json"),
        "containerd_binary": str(host / "containerd"),
    }
    action, trips = _action(args, line_end)
    planned = action.run(task_vars={})
    assert not planned.get("failed"), planned
    assert len(trips) == 3
    apply(host, planned)

    action, trips = _action(args, line_end)
    again = action.run(task_vars={})
    assert not again.get("failed"), again
    assert again["changed"] is False
    assert (again["main_content"], again["dropin_content"]) == (planned["main_content"], planned["dropin_content"])
    assert len(trips) <= NO_OP_COMMANDS, trips

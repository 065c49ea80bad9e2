"""Tests of kubegpu.node.containerd_config's planner against files in a temporary folder, through a Node that runs
commands and reads files locally (the action plugin gives it the same operations over the connection).

containerd itself is a STAND-IN here (a small Python script, see tests/README.md): it prints a fixed default
configuration and merges imports key by key, as containerd 2.x does. The molecule scenario `containerd` runs the
action against the real containerd 1.4, 1.6, 1.7 and 2.1.
"""

from __future__ import annotations

import glob
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
from ansible_collections.kubegpu.node.plugins.plugin_utils import _containerd_config as cc

COLLECTIONS = Path(__file__).resolve().parents[4] / ".tmp" / "collections"
NVIDIA = "/usr/bin/nvidia-container-runtime"

FAKE_CONTAINERD = textwrap.dedent(
    """\
    #!{python}
    # STAND-IN for containerd 2.x: `config default` and `--config FILE config dump` (imports merged key by key).
    import sys, tomllib
    sys.path.insert(0, {collections!r})
    from ansible_collections.kubegpu.node.plugins.plugin_utils._containerd_config import dumps

    DEFAULT = '''version = 3
    imports = []

    [plugins.'io.containerd.cri.v1.runtime']
      enable_cdi = true
      [plugins.'io.containerd.cri.v1.runtime'.containerd]
        default_runtime_name = 'runc'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = false
    '''

    def merge(into, new):
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    args = sys.argv[1:]
    if args == ["config", "default"]:
        print(DEFAULT, end="")
        sys.exit(0)
    assert args[0] == "--config" and args[2:] == ["config", "dump"], args
    merged = tomllib.loads(DEFAULT)
    main = tomllib.load(open(args[1], "rb"))
    merge(merged, main)
    for path in main.get("imports", []):
        merge(merged, tomllib.load(open(path, "rb")))
    merged["version"] = 3
    print(dumps(merged), end="")
    """
)


@pytest.fixture
def host(tmp_path):
    binary = tmp_path / "containerd"
    binary.write_text(FAKE_CONTAINERD.format(python=sys.executable, collections=str(COLLECTIONS)))
    binary.chmod(0o755)
    etc = tmp_path / "etc"
    etc.mkdir()
    return tmp_path


class LocalNode:
    """The planner's Node over this machine's files and the stand-in containerd."""

    def __init__(self, host: Path) -> None:
        self.scratch = host / "tmp"
        self.scratch.mkdir(exist_ok=True)

    def read(self, path: str) -> str | None:
        file = Path(path)
        if not file.exists():
            return None
        try:
            return file.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise cc.ConfigError(f"{path} is not UTF-8 text") from None

    def run(self, argv: list[str]) -> str:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise cc.ConfigError(f"{argv} failed: {proc.stderr}")
        return proc.stdout

    def put(self, name: str, text: str) -> str:
        (self.scratch / name).write_text(text)
        return str(self.scratch / name)

    def glob(self, pattern: str) -> list[str]:
        return glob.glob(pattern)

    def mode(self, path: str) -> str | None:
        return f"{Path(path).stat().st_mode & 0o7777:04o}" if Path(path).exists() else None


DEFAULTS = {
    "state": "present",
    "runtime_name": "nvidia",
    "runtime_path": NVIDIA,
    "systemd_cgroup": None,
    "set_as_default": False,
    "cdi": False,
    "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"],
}


def run(host: Path, **params) -> dict:
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
        return {"changed": False, **cc.Planner(LocalNode(host), args).plan()}
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

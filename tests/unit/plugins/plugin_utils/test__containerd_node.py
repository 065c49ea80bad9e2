"""How kubegpu.node.containerd_config reaches the node (plugins/plugin_utils/_containerd_node.py): its script runs here
in this machine's sh over files in a temporary folder, and its answers are read back as the action reads them."""

from __future__ import annotations

import base64
import fnmatch
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _containerd_config as cc
from ansible_collections.kubegpu.node.plugins.plugin_utils import _containerd_node as cn


def shell(scratch: Path):
    """NodeAction.command on this machine, with the script's temporary folders made under `scratch`."""
    scratch.mkdir(exist_ok=True)

    def run(argv: list[str]) -> dict:
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, env={**os.environ, "TMPDIR": str(scratch)}
        )
        return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    return run


@pytest.fixture
def tree(tmp_path):
    """A node's files: a config folder with a drop-in folder, a hidden file, a link, a folder, a binary file."""
    etc = tmp_path / "etc"
    (etc / "conf.d" / "sub").mkdir(parents=True)
    (etc / "config.toml").write_text("version = 3\n")
    (etc / "config.toml").chmod(0o640)
    (etc / "conf.d" / "10-a.toml").write_text("a = 1\n")
    (etc / "conf.d" / ".hidden.toml").write_text("h = 1\n")
    (etc / "conf.d" / "20-b.conf").write_text("b = 1\n")
    (etc / "conf.d" / "empty.toml").write_text("")
    (etc / "conf.d" / "link.toml").symlink_to(etc / "conf.d" / "10-a.toml")
    (etc / "conf.d" / "dangling.toml").symlink_to(etc / "nowhere")
    (etc / "conf.d" / "sub" / "30-c.toml").write_text("c = 1\n")
    (etc / "conf.d" / "bin.toml").write_bytes(b"\xff\xfe")
    return tmp_path


def test_files_modes_and_globs_in_one_command(tree):
    node = cn.SnapshotNode(shell(tree / "tmp"))
    conf = tree / "etc" / "conf.d"
    node.prefetch(
        files=[str(tree / "etc" / "config.toml"), str(tree / "etc" / "missing.toml")],
        modes=[str(tree / "etc" / "config.toml"), str(tree / "etc" / "missing.toml")],
        globs=[f"{conf}/*"],
        default_unless=None,
    )
    assert node.commands == 1
    assert node.read(str(tree / "etc" / "config.toml")) == "version = 3\n"
    assert node.read(str(tree / "etc" / "missing.toml")) is None
    assert node.mode(str(tree / "etc" / "config.toml")) == "0640"
    assert node.mode(str(tree / "etc" / "missing.toml")) is None
    # containerd's glob (Go) matches hidden files too; links are followed when read; a dangling one is listed.
    assert node.glob(f"{conf}/*.toml") == sorted(
        str(conf / name)
        for name in (".hidden.toml", "10-a.toml", "bin.toml", "dangling.toml", "empty.toml", "link.toml")
    )
    assert node.glob(f"{conf}/1?-[a-z]*.toml") == [str(conf / "10-a.toml")]
    assert node.read(str(conf / ".hidden.toml")) == "h = 1\n"
    assert node.read(str(conf / "link.toml")) == "a = 1\n"
    assert node.read(str(conf / "empty.toml")) == ""
    assert node.read(str(conf / "dangling.toml")) is None
    with pytest.raises(cc.ConfigError, match=r"bin\.toml is not UTF-8 text"):
        node.read(str(conf / "bin.toml"))
    with pytest.raises(cc.ConfigError, match="sub: it is not a regular file"):
        node.read(str(conf / "sub"))
    assert node.commands == 1, "what the first command listed and read is not asked for again"
    assert node.read(str(tree / "etc" / "other.toml")) is None
    assert node.commands == 2


def test_a_glob_the_first_listing_does_not_cover_is_listed_then(tree):
    node = cn.SnapshotNode(shell(tree / "tmp"))
    node.prefetch(files=[], modes=[], globs=[f"{tree}/etc/conf.d/*"], default_unless=None)
    assert node.glob(f"{tree}/etc/*/sub/*.toml") == [f"{tree}/etc/conf.d/sub/30-c.toml"]
    assert node.read(f"{tree}/etc/conf.d/sub/30-c.toml") == "c = 1\n"
    assert node.glob(f"{tree}/etc/conf.d/*/*.toml") == [f"{tree}/etc/conf.d/sub/30-c.toml"]
    assert node.commands == 3


@pytest.mark.parametrize(
    "part",
    ["*.toml", "1?-[a-z].toml", "[!.]*", "[]]x", "a[", "x\\y*", "we'ird $(x) `y`", "*[0-9]*"],
)
def test_the_listing_filter_lets_through_every_name_the_pattern_matches(tmp_path, part):
    names = [
        "10-a.toml", ".hidden.toml", "1x-b.toml", "]x", "a[", "x\\y.toml", "xy", "we'ird $(x) `y`", "a1b", ".x",
        "[]]x", "x\\yz",
    ]  # fmt: skip
    script = 'p=$1; shift; for n; do case $n in $p) echo "$n";; esac; done'
    said = subprocess.run(
        ["sh", "-c", script, "-", cn._case_pattern(part), *names], capture_output=True, text=True, check=True
    )
    let_through = set(said.stdout.splitlines())
    assert {n for n in names if fnmatch.fnmatchcase(n, part)} <= let_through


def test_covers():
    assert cn.covers("/etc/containerd/conf.d/*", "/etc/containerd/conf.d/*.toml")
    assert cn.covers("/etc/containerd/conf.d/*.toml", "/etc/containerd/conf.d/*.toml")
    assert not cn.covers("/etc/containerd/conf.d/*", "/etc/containerd/conf.d/x/*.toml")
    assert not cn.covers("/etc/containerd/conf.d/*", "/etc/containerd/*.toml")
    assert not cn.covers("/etc/containerd/conf.d/*.toml", "/etc/containerd/conf.d/*")


FAKE = """#!/bin/sh
# Prints what containerd would read: `config default`, or the candidate and the drop-in next to it.
echo "$0 $*" >>"$(dirname "$0")/calls"
case $1 in
  config) echo "version = 3 # default"; exit 0;;
  --config) case $(cat "$2") in *fail*) echo "failed to load TOML: $2" >&2; exit 1;; esac
            cat "$2"; [ ! -e "$(dirname "$2")/dropin.toml" ] || cat "$(dirname "$2")/dropin.toml";;
esac
"""


@pytest.fixture
def binary(tmp_path):
    path = tmp_path / "bin" / "containerd"
    path.parent.mkdir()
    path.write_text(FAKE)
    path.chmod(0o755)
    return path


def test_config_default_runs_only_without_a_main_file(tmp_path, binary):
    main = tmp_path / "config.toml"
    node = cn.SnapshotNode(shell(tmp_path / "tmp"), binary=str(binary))
    node.prefetch(files=[str(main)], modes=[], globs=[], default_unless=str(main))
    assert node.config_default() == "version = 3 # default\n"
    assert node.commands == 1
    main.write_text("version = 2\n")
    again = cn.SnapshotNode(shell(tmp_path / "tmp"), binary=str(binary))
    again.prefetch(files=[str(main)], modes=[], globs=[], default_unless=str(main))
    assert (binary.parent / "calls").read_text().count("config default") == 1
    assert again.config_default() == "version = 3 # default\n"  # asked for anyway: one more command
    assert again.commands == 2


@pytest.mark.parametrize("inline_limit", [cn.INLINE_LIMIT, 0], ids=["in the command", "sent as files"])
def test_candidates_are_dumped_from_a_folder_the_command_removes(tmp_path, binary, inline_limit):
    scratch = tmp_path / "tmp"
    staged = tmp_path / "staged"
    staged.mkdir()
    sent: list[str] = []

    def put(name: str, text: str) -> str:
        sent.append(name)
        (staged / name).write_text(text)
        return str(staged / name)

    node = cn.SnapshotNode(shell(scratch), binary=str(binary), put=put, inline_limit=inline_limit)
    base = cc.Trial("base.toml", "version = 3\n")
    candidate = cc.Trial("candidate.toml", f'imports = ["{cc.TRIAL_DROPIN}"]\n', "# the drop-in 'quoted' $HOME\n")
    assert node.config_dump(base, also=[candidate]) == "version = 3\n"
    assert node.config_dump(candidate) == f"imports = [\"{cc.TRIAL_DROPIN}\"]\n# the drop-in 'quoted' $HOME\n"
    assert node.commands == 1
    assert list(scratch.iterdir()) == []
    assert sent == ([] if inline_limit else ["1-base.toml", "2-candidate.toml", "2-dropin.toml"])

    failing = cc.Trial("after.toml", "fail\n")
    with pytest.raises(
        cc.ConfigError, match=r"'\S+containerd --config \S+/1/after.toml config dump' failed \(rc 1\): "
    ):
        node.config_dump(failing)
    assert list(scratch.iterdir()) == []


def test_a_stopped_command_removes_its_folder(tmp_path, binary):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    binary.write_text("#!/bin/sh\nsleep 1\n")
    trial = cc.Trial("base.toml", "version = 3\n")
    argv = cn.argv(["c", trial.name, "b64:" + base64.b64encode(b"version = 3\n").decode(), "-", str(binary)])
    proc = subprocess.Popen(argv, env={**os.environ, "TMPDIR": str(scratch)}, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not list(scratch.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(scratch.iterdir()), "the command made no folder"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 143
    assert list(scratch.iterdir()) == []


def test_parse_reads_the_sections_and_refuses_a_damaged_one():
    out = "\n".join(
        [
            "@@file /etc/a b.toml",
            base64.b64encode(b"x = 1\n").decode(),
            "@@nofile /etc/none",
            "@@notfile /etc/dir",
            "@@mode 644 /etc/a b.toml",
            "@@nomode /etc/none",
            "@@match /etc/conf.d/x.toml",
            "@@dump 1 /tmp/t/1/base.toml",
            "@@stderr",
            base64.b64encode(b"bad\n").decode(),
            "@@end",
        ]
    )
    answer = cn.parse(out)
    assert answer.files == {"/etc/a b.toml": b"x = 1\n", "/etc/none": None}
    assert answer.unusable == {"/etc/dir": "it is not a regular file"}
    assert answer.modes == {"/etc/a b.toml": "0644", "/etc/none": None}
    assert answer.matches == ["/etc/conf.d/x.toml"]
    assert answer.dumps == [cn.Ran(1, "", "bad\n", "/tmp/t/1/base.toml")]
    assert answer.complete
    with pytest.raises(cn.ReadError, match="/etc/a is damaged"):
        cn.parse("@@file /etc/a\n#not base64#\n@@end\n")


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        ({"rc": 0, "stdout": "@@nofile /etc/a\n", "stderr": ""}, r"failed \(rc 0\): @@nofile"),
        ({"rc": 255, "stdout": "", "stderr": "ssh: connection closed\n"}, r"\(rc 255\): ssh: connection closed"),
        ({"rc": 3, "stdout": "@@error cannot make a temporary folder\n", "stderr": ""}, "temporary folder"),
    ],
    ids=["cut off", "connection lost", "no temporary folder"],
)
def test_an_answer_without_its_end_is_refused(outcome, message):
    node = cn.SnapshotNode(lambda argv: outcome)
    with pytest.raises(cn.ReadError, match=message):
        node.read("/etc/a")


def test_a_name_with_a_line_break_that_an_import_may_name_is_refused(tmp_path):
    (tmp_path / "a\n@@file x.toml").write_text("")
    (tmp_path / "b\n.conf").write_text("")
    node = cn.SnapshotNode(shell(tmp_path / "tmp"))
    assert node.glob(f"{tmp_path}/*.conf-not") == []
    with pytest.raises(cc.ConfigError, match="has a line break"):
        node.glob(f"{tmp_path}/*.toml")

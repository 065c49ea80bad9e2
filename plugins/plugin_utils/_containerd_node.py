# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of the kubegpu.node.containerd_config action, not a public API: it can change at any time.
# How the containerd planner reaches the node: one POSIX sh script (SCRIPT) that answers a list of requests in one
# command (files, modes, glob listings, `containerd config default`, `containerd config dump` of candidates sent
# inside the command), its output parsed here, and SnapshotNode, the planner's Node over those answers. A no-op plan
# costs two commands: the first read, then the base dump together with the candidate the files on disk already hold.

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _apt
from ansible_collections.kubegpu.node.plugins.plugin_utils import _containerd_config as cc

# Requests, as the script's arguments (several in one command, answered in order):
#   f PATH              the file: @@file PATH + base64 | @@nofile PATH | @@notfile PATH | @@unreadable PATH
#   m PATH              its own mode (a link is not followed): @@mode MODE PATH | @@nomode PATH
#   g ROOT C1/../CN     the paths ROOT/C1/.../CN names (Ci: `case` patterns, which also match a leading dot as
#                       containerd's Go glob does): @@match PATH each, followed by its f section
#   d PATH BIN          unless PATH exists: BIN config default: @@default RC + base64 of its output, @@stderr + base64
#   c NAME MAIN DROPIN BIN
#                       BIN --config T/NAME config dump, where T is a new folder of the script's temporary one that
#                       holds MAIN as NAME and DROPIN as dropin.toml (cc.TRIAL_DROPIN); MAIN and DROPIN are b64:DATA,
#                       file:PATH (a file already on the node) or - (none): @@dump RC T/NAME + base64, @@stderr + base64
# The temporary folder is made only for d and c, mode 0700, and removed when the script ends or is stopped.
SCRIPT = r"""set -u
umask 077
t=
trap '[ -z "$t" ] || rm -rf "$t"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
nl='
'
i=0
tmp() { [ -n "$t" ] || t=$(mktemp -d) || { echo "@@error cannot make a temporary folder"; exit 3; }; }
readf() {
  if [ -f "$1" ]; then
    if out=$(base64 "$1" 2>/dev/null); then echo "@@file $1"; printf '%s\n' "$out"; else echo "@@unreadable $1"; fi
  elif [ -e "$1" ]; then echo "@@notfile $1"
  else echo "@@nofile $1"
  fi
}
walk() {
  case $2 in */*) pat=${2%%/*}; next=${2#*/};; *) pat=$2; next=;; esac
  for e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    case ${e##*/} in $pat) ;; *) continue;; esac
    case $e in *"$nl"*) echo "@@oddname $1"; continue;; esac
    if [ -z "$next" ]; then echo "@@match $e"; readf "$e"
    elif [ -d "$e" ]; then (walk "$e" "$next"); fi
  done
}
put() {
  case $1 in
    b64:*) printf '%s' "${1#b64:}" | base64 -d >"$2";;
    file:*) cp -- "${1#file:}" "$2";;
    *) return 1;;
  esac
}
ran() { base64 "$t/out"; echo "@@stderr"; base64 "$t/err"; }
while [ $# -gt 0 ]; do
  case $1 in
    f) readf "$2"; shift 2;;
    m) if [ -e "$2" ] || [ -L "$2" ]; then echo "@@mode $(stat -c %a -- "$2") $2"; else echo "@@nomode $2"; fi
       shift 2;;
    g) walk "$2" "$3"; shift 3;;
    d) if [ -z "$2" ] || ! [ -e "$2" ]; then
         tmp; "$3" config default >"$t/out" 2>"$t/err"; echo "@@default $?"; ran
       fi
       shift 3;;
    c) tmp; i=$((i + 1)); mkdir "$t/$i" && put "$3" "$t/$i/$2" && { [ "$4" = - ] || put "$4" "$t/$i/dropin.toml"; }
       if [ $? -eq 0 ]; then "$5" --config "$t/$i/$2" config dump >"$t/out" 2>"$t/err"; echo "@@dump $? $t/$i/$2"
       else : >"$t/out"; echo "the candidate could not be written to $t/$i" >"$t/err"; echo "@@dump 125 $t/$i/$2"
       fi
       ran; shift 5;;
    *) echo "@@error unknown request $1"; exit 2;;
  esac
done
echo "@@end"
"""

# The candidates travel inside the command while their base64 stays under this (a command is one argument of ssh,
# sh -c and sudo: Linux takes at most 128 KiB in one); larger ones are sent as files first.
INLINE_LIMIT = 64 * 1024


class ReadError(cc.ConfigError):
    """The node's answer is not what SCRIPT prints (cut off, or not from it)."""


@dataclass
class Ran:
    """What a command on the node gave: its exit status, output and error output; `where`: the file it was run on."""

    rc: int
    stdout: str = ""
    stderr: str = ""
    where: str = ""


@dataclass
class Answer:
    """SCRIPT's output, parsed."""

    files: dict[str, bytes | None] = field(default_factory=dict)
    unusable: dict[str, str] = field(default_factory=dict)
    modes: dict[str, str | None] = field(default_factory=dict)
    matches: list[str] = field(default_factory=list)
    odd_names: list[str] = field(default_factory=list)
    default: Ran | None = None
    dumps: list[Ran] = field(default_factory=list)
    error: str = ""
    complete: bool = False


def _b64(lines: Iterable[str], what: str) -> bytes:
    try:
        return base64.b64decode("".join(line.strip() for line in lines), validate=True)
    except (binascii.Error, ValueError):
        raise ReadError(f"the node's answer for {what} is damaged (its base64 does not decode)") from None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def parse(stdout: str) -> Answer:
    """SCRIPT's output to an Answer; raises ReadError where a section is damaged."""
    answer = Answer()
    pending: Ran | None = None
    for header, lines in _apt.sections(stdout):
        name, _sep, rest = header.partition(" ")
        if name == "file":
            answer.files[os.path.normpath(rest)] = _b64(lines, rest)
        elif name == "nofile":
            answer.files[os.path.normpath(rest)] = None
        elif name == "notfile":
            answer.unusable[os.path.normpath(rest)] = "it is not a regular file"
        elif name == "unreadable":
            answer.unusable[os.path.normpath(rest)] = "it cannot be read"
        elif name == "mode":
            mode, _sep, path = rest.partition(" ")
            if not mode.isdigit():
                raise ReadError(f"the node gave no mode for {path}")
            answer.modes[os.path.normpath(path)] = mode.zfill(4)
        elif name == "nomode":
            answer.modes[os.path.normpath(rest)] = None
        elif name == "match":
            answer.matches.append(os.path.normpath(rest))
        elif name == "oddname":
            answer.odd_names.append(rest)
        elif name in ("default", "dump"):
            rc, _sep, where = rest.partition(" ")
            if not rc.lstrip("-").isdigit():
                raise ReadError(f"the node's answer has a damaged {name} section")
            pending = Ran(int(rc), _text(_b64(lines, f"containerd config {name}")), "", where)
            if name == "default":
                answer.default = pending
            else:
                answer.dumps.append(pending)
        elif name == "stderr" and pending is not None:
            pending.stderr = _text(_b64(lines, "containerd's error output"))
            pending = None
        elif name == "error":
            answer.error = rest
        elif name == "end":
            answer.complete = True
    return answer


# ---------------------------------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------------------------------

_GLOB_CHARS = "*?["


def _case_pattern(part: str) -> str:
    """A `case` pattern that matches every name `part` matches (cc.pattern_matches, fnmatch): classes become '?',
    and the characters a pattern taken from a variable would read otherwise ('[', ']', '\\') become wildcards."""
    out: list[str] = []
    i = 0
    while i < len(part):
        char = part[i]
        if char == "[":
            j = i + 1
            if j < len(part) and part[j] in "!^":
                j += 1
            if j < len(part) and part[j] == "]":
                j += 1
            while j < len(part) and part[j] != "]":
                j += 1
            out.append("?")
            i = j + 1 if j < len(part) else i + 1
            continue
        out.append("*" if char == "\\" else "?" if char == "]" else char)
        i += 1
    return "".join(out)


def glob_request(pattern: str) -> list[str]:
    """The `g` request that lists at least every path `pattern` names (a '*' never crosses a '/')."""
    parts = os.path.normpath(pattern).split("/")
    fixed = next((i for i, part in enumerate(parts) if any(c in part for c in _GLOB_CHARS)), len(parts) - 1)
    root = "/".join(parts[:fixed])
    names = [_case_pattern(part) for part in parts[fixed:]]
    return ["g", root if root else ("" if pattern.startswith("/") else "."), "/".join(names)]


def covers(listed: str, pattern: str) -> bool:
    """Whether a listing made for `listed` holds every path that `pattern` names."""
    outer, inner = os.path.normpath(listed).split("/"), os.path.normpath(pattern).split("/")
    return len(outer) == len(inner) and all(a == b or a == "*" for a, b in zip(outer, inner))


def _source(text: str | None) -> str:
    return "-" if text is None else "b64:" + base64.b64encode(text.encode("utf-8")).decode("ascii")


def argv(requests: Sequence[str]) -> list[str]:
    return ["sh", "-c", SCRIPT, "containerd-config", *requests]


# ---------------------------------------------------------------------------------------------------------------------
# The planner's Node over the script's answers
# ---------------------------------------------------------------------------------------------------------------------


class SnapshotNode:
    """cc.Node over SCRIPT: every answer is kept, so the planner asks the node only for what it has not read yet.

    `run(argv)` runs a command on the node and returns {'rc', 'stdout', 'stderr'} (NodeAction.command); `put(name,
    text)` writes a scratch file on the node and returns its path (only for candidates too large for the command line).
    `commands` counts the commands run.
    """

    def __init__(
        self,
        run: Callable[[list[str]], dict[str, Any]],
        binary: str = "containerd",
        put: Callable[[str, str], str] | None = None,
        inline_limit: int = INLINE_LIMIT,
    ) -> None:
        self._run = run
        self._put = put
        self.binary = binary or "containerd"
        self.inline_limit = inline_limit
        self.commands = 0
        self.files: dict[str, bytes | None] = {}
        self.unusable: dict[str, str] = {}
        self.modes: dict[str, str | None] = {}
        self.listed: list[str] = []
        self.matches: set[str] = set()
        self.default: Ran | None = None
        self.dumps: dict[cc.Trial, Ran] = {}

    # The node's side ------------------------------------------------------------------------------------------------

    def fetch(
        self,
        files: Iterable[str] = (),
        modes: Iterable[str] = (),
        globs: Iterable[str] = (),
        default_unless: str | None = None,
        trials: Sequence[cc.Trial] = (),
    ) -> None:
        """One command for all of these; the answers join what is known."""
        requests: list[str] = []
        for path in dict.fromkeys(os.path.normpath(p) for p in files):
            requests += ["f", path]
        for path in dict.fromkeys(os.path.normpath(p) for p in modes):
            requests += ["m", path]
        globs = list(dict.fromkeys(os.path.normpath(p) for p in globs))
        for pattern in globs:
            requests += glob_request(pattern)
        if default_unless is not None:
            requests += ["d", default_unless, self.binary]
        trials = list(dict.fromkeys(trials))
        requests += self._candidates(trials)
        if not requests:
            return
        self.commands += 1
        outcome = self._run(argv(requests))
        answer = parse(outcome.get("stdout") or "")
        if not answer.complete or outcome.get("rc") != 0:
            said = answer.error or (outcome.get("stderr") or outcome.get("stdout") or "").strip()[-2000:]
            raise ReadError(
                f"reading containerd's configuration on the node failed (rc {outcome.get('rc')}): {said or 'no answer'}"
            )
        if answer.odd_names:
            raise cc.ConfigError(
                f"{answer.odd_names[0]} holds a file whose name has a line break; containerd's imports may name it, "
                "so rename or remove it first"
            )
        if len(answer.dumps) != len(trials) or (default_unless == "" and answer.default is None):
            raise ReadError("the node's answer is cut off (containerd config dump or default is missing)")
        self.files.update(answer.files)
        self.unusable.update(answer.unusable)
        self.modes.update(answer.modes)
        self.listed += globs
        self.matches.update(answer.matches)
        if answer.default is not None:
            self.default = answer.default
        self.dumps.update(zip(trials, answer.dumps))

    def _candidates(self, trials: Sequence[cc.Trial]) -> list[str]:
        sources = [(_source(trial.main), _source(trial.dropin)) for trial in trials]
        inline = sum(len(main) + len(dropin) for main, dropin in sources) <= self.inline_limit
        requests: list[str] = []
        for number, (trial, (main, dropin)) in enumerate(zip(trials, sources), start=1):
            if not inline:
                if self._put is None:
                    raise cc.ConfigError("containerd's candidate configuration is too large to send in one command")
                main = "file:" + self._put(f"{number}-{trial.name}", trial.main)
                if trial.dropin is not None:
                    dropin = "file:" + self._put(f"{number}-{cc.TRIAL_DROPIN}", trial.dropin)
            requests += ["c", trial.name, main, dropin, self.binary]
        return requests

    # cc.Node ----------------------------------------------------------------------------------------------------------

    def prefetch(
        self, files: Iterable[str], modes: Iterable[str], globs: Iterable[str], default_unless: str | None
    ) -> None:
        self.fetch(files=files, modes=modes, globs=globs, default_unless=default_unless)

    def read(self, path: str) -> str | None:
        path = os.path.normpath(path)
        if path not in self.files and path not in self.unusable:
            self.fetch(files=[path])
        if path in self.unusable:
            raise cc.ConfigError(f"cannot read {path}: {self.unusable[path]}")
        data = self.files.get(path)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise cc.ConfigError(
                f"{path} is not UTF-8 text (containerd's TOML must be); it was left untouched"
            ) from None

    def mode(self, path: str) -> str | None:
        path = os.path.normpath(path)
        if path not in self.modes:
            self.fetch(modes=[path])
        return self.modes.get(path)

    def glob(self, pattern: str) -> list[str]:
        if not any(covers(listed, pattern) for listed in self.listed):
            self.fetch(globs=[pattern])
        return sorted(path for path in self.matches if cc.pattern_matches(pattern, path))

    def config_default(self) -> str:
        if self.default is None:
            self.fetch(default_unless="")
        if self.default is None:  # fetch refuses an answer without it; this keeps the type checker and readers sure
            raise ReadError("the node's answer has no containerd config default")
        return self._output(self.default, f"{self.binary} config default")

    def config_dump(self, trial: cc.Trial, also: Sequence[cc.Trial] = ()) -> str:
        if trial not in self.dumps:
            self.fetch(trials=[trial, *(t for t in also if t not in self.dumps)])
        ran = self.dumps[trial]
        return self._output(ran, f"{self.binary} --config {ran.where} config dump")

    @staticmethod
    def _output(ran: Ran, command: str) -> str:
        if ran.rc != 0:
            raise cc.ConfigError(f"'{command}' failed (rc {ran.rc}): {(ran.stderr or ran.stdout).strip()}")
        return ran.stdout

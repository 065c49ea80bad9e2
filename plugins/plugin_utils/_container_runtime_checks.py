# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private, not a public API: the decisions of the container_runtime role's checks (the action
# kubegpu.node.container_runtime_checks): which runtimes are installed, which to configure, what refuses the run, and
# when a run takes over what the preflight found. Pure functions; the action runs the one read on the node.

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The one read on the node (POSIX sh): $1 the containerd binary whose `config dump` is read ("" for none), $2 the
# nvidia-container-runtime to look for ("" for none), then a binary name for each runtime. `test -x` is true for a
# path that exists (links followed) and that the user may execute, which is what the check has always asked of it.
NODE_SCRIPT = """\
dump=$1 nvidia=$2
shift 2
i=0
for name in "$@"; do
  if command -v "$name" >/dev/null 2>&1; then echo "found $i"; fi
  i=$((i + 1))
done
if [ -n "$dump" ] && command -v "$dump" >/dev/null 2>&1; then
  "$dump" config dump 2>/dev/null | grep -E '^disabled_plugins'
fi
if [ -n "$nvidia" ]; then
  if [ -x "$nvidia" ]; then echo 'nvidia executable'; else echo 'nvidia missing'; fi
fi
echo done
exit 0
"""

# Docker CE's containerd.io ships with its CRI plugin disabled (containerd 1.x names it "cri", 2.x
# "io.containerd.grpc.v1.cri"): there containerd only serves Docker, and no kubelet talks to it. `config dump` quotes
# strings with double quotes in 1.x and with single quotes in 2.x (go-toml v2 writes literal strings: `interval =
# '10s'`, `[plugins.'io.containerd.internal.v1.restart']` in the migration test output of containerd/containerd#10907),
# so either quote counts, the same on both sides.
_CRI_DISABLED = re.compile(r"""(["'])(io\.containerd\.grpc\.v1\.)?cri\1""")


class NodeAnswerError(ValueError):
    """The node's answer to the read is not the script's (cut off, or something else answered)."""


@dataclass(frozen=True)
class NodeRead:
    """What the node said: the runtimes whose binary it found (in the order of the binaries table), containerd's
    disabled_plugins lines (when they were asked for) and whether nvidia-container-runtime is executable (None when
    it was not asked for)."""

    installed: tuple[str, ...]
    disabled_plugins: tuple[str, ...]
    nvidia_runtime_ok: bool | None


def node_argv(binaries: Mapping[str, str], dump_binary: str, nvidia_runtime_path: str) -> list[str]:
    """The command that reads the node: each runtime's binary by `command -v`; `dump_binary config dump`'s
    disabled_plugins line when dump_binary is given; whether nvidia_runtime_path is executable when it is given."""
    return ["sh", "-c", NODE_SCRIPT, "kubegpu-runtime-checks", dump_binary, nvidia_runtime_path, *binaries.values()]


def nvidia_argv(nvidia_runtime_path: str) -> list[str]:
    """The command that only looks for nvidia-container-runtime (a run that took the preflight's findings over)."""
    return node_argv({}, "", nvidia_runtime_path)


def parse_node(stdout: str, binaries: Mapping[str, str]) -> NodeRead:
    """The script's output (node_argv with the same binaries) as a NodeRead. Raises NodeAnswerError when the answer
    does not end as the script ends, or holds a line the script does not print."""
    lines = [line for line in stdout.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[-1].strip() != "done":
        raise NodeAnswerError(f"the node's answer to the runtime search is cut off: {stdout.strip()[-200:]!r}")
    engines = list(binaries)
    found: set[int] = set()
    disabled: list[str] = []
    nvidia: bool | None = None
    for line in lines[:-1]:
        words = line.split()
        if len(words) == 2 and words[0] == "found" and words[1].isdigit() and int(words[1]) < len(engines):
            found.add(int(words[1]))
        elif line.startswith("disabled_plugins"):
            disabled.append(line)
        elif line.strip() in ("nvidia executable", "nvidia missing"):
            nvidia = line.strip() == "nvidia executable"
        else:
            raise NodeAnswerError(f"unexpected line in the node's answer to the runtime search: {line!r}")
    return NodeRead(tuple(engines[i] for i in sorted(found)), tuple(disabled), nvidia)


def cri_disabled(disabled_plugins: Sequence[str]) -> bool:
    """Whether containerd's disabled_plugins lines disable its CRI plugin."""
    return bool(_CRI_DISABLED.search("\n".join(disabled_plugins)))


def engines_to_configure(given: Sequence[str], installed: Sequence[str], containerd_cri_disabled: bool) -> list[str]:
    """The runtimes to configure: those given, or else each installed one, except a containerd whose CRI plugin is
    disabled (Docker's own)."""
    if given:
        return list(given)
    skipped = {"containerd"} if containerd_cri_disabled else set()
    return [engine for engine in installed if engine not in skipped]


def problems(
    host: str,
    state: str,
    engines: Sequence[str],
    installed: Sequence[str],
    require_nvidia_runtime: bool,
    nvidia_runtime_path: str,
    nvidia_runtime_ok: bool | None,
) -> list[str]:
    """What refuses the run, one sentence each: a runtime asked for that is not installed, no runtime to configure
    (state present), nvidia-container-runtime missing or not executable (state present, when it is required)."""
    found: list[str] = []
    missing = list(dict.fromkeys(engine for engine in engines if engine not in installed))
    if missing:
        found.append(
            f"container_runtime_engines names {', '.join(missing)}, which is not installed on {host} (installed: "
            f"{', '.join(installed) or 'none'}). Install it first, or leave it out of container_runtime_engines."
        )
    if state == "present" and not engines:
        found.append(
            f"No container runtime (dockerd, containerd, crio) was found on {host}. Install one first, or set "
            "container_runtime_engines."
        )
    if nvidia_required(state, require_nvidia_runtime) and not nvidia_runtime_ok:
        found.append(
            f"{nvidia_runtime_path} does not exist or is not executable on {host}. Install the NVIDIA Container "
            "Toolkit first (role kubegpu.node.nvidia_container_toolkit), point container_runtime_nvidia_runtime_path "
            "at the binary, or set container_runtime_require_nvidia_runtime to false."
        )
    return found


def nvidia_required(state: str, require_nvidia_runtime: bool) -> bool:
    """Whether the run looks for nvidia-container-runtime."""
    return state == "present" and require_nvidia_runtime


def hand_over(given: Sequence[str], state: str) -> dict[str, object]:
    """What the preflight hands to the role's next run on the host: the inputs its findings were made from."""
    return {"engines": list(given), "state": state}


def takes_over(found: Mapping[str, object], given: Sequence[str], state: str) -> bool:
    """Whether a run takes over an earlier task's findings (`found`, its result) instead of searching again: only a
    preflight's, not spent yet, made from the same container_runtime_engines and container_runtime_state."""
    offered = found.get("handover")
    if not offered or offered != hand_over(given, state):
        return False
    return isinstance(found.get("installed"), list) and isinstance(found.get("engines"), list)

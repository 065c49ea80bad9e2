"""The PLAY RECAP of an ansible-playbook run, read per host.

Idempotence is judged per host from the recap: every host expected must be in it, with changed=0 (and failed=0,
unreachable=0). Searching the whole output for "changed=1" misses changed=2, a host missing from the recap, and a
recap that was never printed.

Used by the integration tests (tests/integration/conftest.py) and, as a command, by shell scripts such as the demo:

    python3 tests/ansible_recap.py --unchanged LOG [HOST ...]

exits 1 and says which hosts changed, failed, were unreachable, or are missing from the recap.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HEADER = re.compile(r"^PLAY RECAP \**\s*$")
_LINE = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:[a-z]+=\d+\s*)+)$")
_COUNT = re.compile(r"([a-z]+)=(\d+)")

# The counters that say a host was not left as it was, or not reached.
BAD = ("changed", "failed", "unreachable")


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    """Each host's counters from the last PLAY RECAP of the output ({} when there is none)."""
    lines = _ANSI.sub("", output).splitlines()
    starts = [i for i, line in enumerate(lines) if _HEADER.match(line)]
    if not starts:
        return {}
    recap: dict[str, dict[str, int]] = {}
    for line in lines[starts[-1] + 1 :]:
        match = _LINE.match(line.strip())
        if match is None:
            if line.strip():
                break
            continue
        recap[match["host"]] = {name: int(value) for name, value in _COUNT.findall(match["counts"])}
    return recap


def problems(
    recap: Mapping[str, Mapping[str, int]], hosts: Iterable[str] | None = None, counters: Iterable[str] = BAD
) -> list[str]:
    """What keeps the run from being a no-op: a host expected and missing, or a host with a bad counter above 0.

    Without hosts, every host of the recap is judged (and an empty recap is a problem: the run printed none).
    """
    expected = list(hosts) if hosts is not None else list(recap)
    found: list[str] = []
    if not recap:
        found.append("no PLAY RECAP in the output")
    for host in expected:
        if host not in recap:
            if recap:
                found.append(f"{host}: not in the PLAY RECAP")
            continue
        bad = [f"{name}={recap[host].get(name, 0)}" for name in counters if recap[host].get(name, 0) > 0]
        if bad:
            found.append(f"{host}: {' '.join(bad)}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--unchanged", action="store_true", required=True, help="fail when a host is not unchanged")
    parser.add_argument("log", type=Path, help="the output of ansible-playbook")
    parser.add_argument("hosts", nargs="*", help="hosts that must be in the recap (default: those it lists)")
    args = parser.parse_args(argv)
    recap = parse_recap(args.log.read_text(errors="replace"))
    found = problems(recap, args.hosts or None)
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

"""Serve a built repository folder over HTTP to the test containers, as a background process.

``start`` binds BIND (podman's host address 10.88.0.1 by default: containers reach it as host.containers.internal,
and nothing outside this machine can) on a free port, writes STATE/server.json ({"pid", "port", "bind", "root"}),
logs each request as one line to STATE/requests.log ("GET /good/stable/deb/amd64/InRelease 200"), and exits by
itself after LIFETIME seconds so that a test run that dies cannot leave it behind. ``stop`` ends exactly the process
that ``start`` recorded.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


class _Handler(http.server.SimpleHTTPRequestHandler):
    request_log: Path

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        line = f"{time.time():.3f} {self.command} {self.path} {code}\n"
        with self.request_log.open("a", encoding="utf-8") as fh:
            fh.write(line)

    def log_message(self, format: str, *args: object) -> None:
        pass


def run_server(root: Path, bind: str, state: Path, lifetime: float) -> None:
    """The server process itself (``serve.py _run``)."""
    handler = functools.partial(_Handler, directory=str(root))
    _Handler.request_log = state / "requests.log"
    server = http.server.ThreadingHTTPServer((bind, 0), handler)
    info = {"pid": os.getpid(), "port": server.server_address[1], "bind": bind, "root": str(root)}
    tmp = state / "server.json.tmp"
    tmp.write_text(json.dumps(info) + "\n", encoding="utf-8")
    tmp.replace(state / "server.json")
    threading.Timer(lifetime, server.shutdown).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


def _alive(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith(b"aptrepo") for part in cmdline) and b"_run" in cmdline


def stop(state: Path) -> bool:
    """Stop the server recorded in ``state``; false when none was running."""
    info_file = state / "server.json"
    if not info_file.exists():
        return False
    pid = json.loads(info_file.read_text(encoding="utf-8"))["pid"]
    info_file.unlink()
    if not _alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not _alive(pid):
            break
        time.sleep(0.1)
    return True


def start(root: Path, bind: str, state: Path, lifetime: float) -> dict[str, object]:
    """Start a server for ``root`` (after stopping one this state folder recorded); returns server.json."""
    state.mkdir(parents=True, exist_ok=True)
    stop(state)
    (state / "requests.log").write_text("", encoding="utf-8")
    log = (state / "server.err").open("w", encoding="utf-8")
    package_dir = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": package_dir + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = subprocess.Popen(
        [sys.executable, "-m", "aptrepo", "_run", str(root), bind, str(state), str(lifetime)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    for _ in range(100):
        if (state / "server.json").exists():
            return json.loads((state / "server.json").read_text(encoding="utf-8"))
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the repository server did not start: {(state / 'server.err').read_text(encoding='utf-8')}")

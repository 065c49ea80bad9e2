"""``python -m aptrepo`` (with tests/ on PYTHONPATH): build a signed repository from a spec, or serve one.

    python -m aptrepo build SPEC OUT
    python -m aptrepo serve start OUT STATE [--bind 10.88.0.1] [--lifetime 3600]
    python -m aptrepo serve stop STATE

``build`` and ``serve start`` print a JSON object (keys.json; server.json) on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import build as builder
from . import serve


def main(argv: list[str]) -> int:
    if argv[:1] == ["_run"]:
        root, bind, state, lifetime = argv[1:5]
        serve.run_server(Path(root), bind, Path(state), float(lifetime))
        return 0
    parser = argparse.ArgumentParser(prog="python -m aptrepo")
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="build the signed trees of a spec")
    build_cmd.add_argument("spec", type=Path)
    build_cmd.add_argument("out", type=Path)
    serve_cmd = commands.add_parser("serve", help="start or stop the HTTP server")
    actions = serve_cmd.add_subparsers(dest="action", required=True)
    start_cmd = actions.add_parser("start")
    start_cmd.add_argument("root", type=Path)
    start_cmd.add_argument("state", type=Path)
    start_cmd.add_argument("--bind", default="10.88.0.1")
    start_cmd.add_argument("--lifetime", type=float, default=3600.0)
    stop_cmd = actions.add_parser("stop")
    stop_cmd.add_argument("state", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        print(json.dumps(builder.build(args.spec.resolve(), args.out.resolve())))
    elif args.action == "start":
        print(json.dumps(serve.start(args.root.resolve(), args.bind, args.state.resolve(), args.lifetime)))
    else:
        print(json.dumps({"stopped": serve.stop(args.state.resolve())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

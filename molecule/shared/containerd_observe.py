"""What molecule/shared/tasks/containerd_observe.yml read on a node (KEY=VALUE lines on stdin, texts base64), as
JSON: containerd's merged configuration and config.toml parsed with tomllib (Python 3.11, on the controller: the
nodes may have Python 3.9). tomllib refuses a key defined twice, as containerd does: a second `imports` line fails."""

import base64
import json
import sys

import tomllib

fields = dict(line.split("=", 1) for line in sys.stdin.read().splitlines() if "=" in line)


def text(key: str) -> str:
    return base64.b64decode(fields.get(key, "")).decode("utf-8")


if fields.get("dump_rc") != "0":
    sys.exit(f"containerd config dump failed (rc {fields.get('dump_rc')}): {text('dump_error')}")
dump = tomllib.loads(text("dump"))
plugin = "io.containerd.cri.v1.runtime" if dump.get("version") == 3 else "io.containerd.grpc.v1.cri"
main = text("main") if fields.get("main_exists") == "true" else None
observed = {
    "dump": dump,
    "cri": dump["plugins"][plugin],
    "main_text": main,
    "main_doc": tomllib.loads(main) if main is not None else None,
    "dropin": fields.get("dropin") == "true",
    "record": fields.get("record") == "true",
    "note": fields.get("note") == "true",
    "active": fields.get("active", ""),
    "ctr_rc": int(fields.get("ctr_rc", "-1")),
    "ctr_output": text("ctr"),
    "pid": fields.get("pid", ""),
}
print(json.dumps(observed, default=str))

# STAND-IN for CRI-O, which cannot be obtained on the test machines (see tests/README.md). It reads the configuration
# the way CRI-O does (crio.conf, then each file in crio.conf.d in lexical order, merged key by key) and refuses to
# start, as CRI-O does, when a file is not TOML, when default_runtime names no configured runtime, or when a runtime's
# runtime_path is not an executable. `crio config` prints the merged configuration as JSON. It runs no containers.
import json
import os
import socket
import sys
import time

try:
    import tomllib

    def parse(data):
        return tomllib.loads(data.decode("utf-8"))

    DecodeError = tomllib.TOMLDecodeError
except ImportError:  # Python before 3.11 (Debian 11): Debian's python3-toml
    import toml

    def parse(data):
        return toml.loads(data.decode("utf-8"))

    DecodeError = toml.TomlDecodeError

CONF = "/etc/crio/crio.conf"
CONF_DIR = "/etc/crio/crio.conf.d"
# CRI-O's built-in runtime when nothing else is configured.
BUILTIN = {"crio": {"runtime": {"default_runtime": "crun", "runtimes": {"crun": {"runtime_path": "/usr/bin/runc"}}}}}


def merge(into, new):
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def load():
    merged = json.loads(json.dumps(BUILTIN))
    files = [CONF] if os.path.exists(CONF) else []
    if os.path.isdir(CONF_DIR):
        files += [os.path.join(CONF_DIR, name) for name in sorted(os.listdir(CONF_DIR))]
    for path in files:
        with open(path, "rb") as handle:
            try:
                merge(merged, parse(handle.read()))
            except DecodeError as exc:
                fatal(f"crio (stand-in): {path}: {exc}")
    runtime = merged["crio"]["runtime"]
    if runtime["default_runtime"] not in runtime["runtimes"]:
        fatal(f"crio (stand-in): default_runtime {runtime['default_runtime']!r} is not a configured runtime")
    for name, entry in runtime["runtimes"].items():
        path = entry.get("runtime_path", "")
        if path and not os.access(path, os.X_OK):
            fatal(f"crio (stand-in): validating runtime config: runtime {name}: {path} is not executable")
    return merged


def fatal(message):
    """Exit the way CRI-O does on a configuration it refuses: one logrus line at level fatal."""
    sys.exit(f'level=fatal msg="{message}"')


def main():
    if sys.argv[1:] == ["config"]:
        print(json.dumps(load()))
        return
    if sys.argv[1:] == ["--version"]:
        print("crio version 0.0.0-standin")
        return
    load()
    address = os.environ.get("NOTIFY_SOCKET")
    if address:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.connect("\0" + address[1:] if address.startswith("@") else address)
            notify.sendall(b"READY=1")
    while True:
        time.sleep(3600)


main()

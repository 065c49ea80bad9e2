# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A STAND-IN for the kubelet, for the molecule tests only (no kubelet can be had on the test machines).

It starts the way the real kubelet does under systemd (the package's unit, kubeadm's drop-in and its environment
files), reads the same flags (--config, --config-dir, --feature-gates, in either --flag=value or --flag value form),
the KubeletConfiguration file and the drop-in folder, and validates the feature gates as the real kubelet of its
version does: "unrecognized feature gate: NAME" for a gate that version does not know, "cannot set feature gate NAME
to V, feature is locked to D" for a locked one, both fatal (exit 1). Otherwise it runs and answers /healthz on
127.0.0.1:10248, and writes what it runs with to /run/kubelet-standin/state.json for the tests to read.

`kubelet --version` prints "Kubernetes vX.Y.Z", X.Y.Z read from /etc/kubelet-standin/version (the test writes it).
Runs on Python 3.8 and later, with Debian's python3-yaml.
"""

import datetime
import http.server
import json
import os
import sys

VERSION_FILE = "/etc/kubelet-standin/version"
STATE_DIR = "/run/kubelet-standin"
HEALTHZ = ("127.0.0.1", 10248)

# What the modelled kubelet knows: gate -> [(since minor, stage, default, locked, source)]. Kept apart from the
# role's table on purpose: this one models Kubernetes, the role's decides.
GATES = {
    "Accelerators": [
        ((1, 6), "alpha", False, False, "pkg/features/kube_features.go v1.6.0"),
        ((1, 11), "removed", False, False, "kubernetes/kubernetes#61498, v1.11.0"),
    ],
    "DevicePlugins": [
        ((1, 8), "alpha", False, False, "pkg/features/kube_features.go v1.8.0"),
        ((1, 10), "beta", True, False, "CHANGELOG-1.10: device plugins beta"),
        ((1, 26), "ga", True, True, "CHANGELOG-1.26: DevicePlugins GA, LockToDefault"),
        ((1, 28), "removed", False, False, "kubernetes/kubernetes#117656, v1.28.0"),
    ],
    "DevicePluginCDIDevices": [
        ((1, 28), "alpha", False, False, "KEP-4009, v1.28.0"),
        ((1, 29), "beta", True, False, "CHANGELOG-1.29"),
        ((1, 31), "ga", True, True, "kubernetes/kubernetes#123315, #125687, v1.31.0"),
        ((1, 34), "removed", False, False, "kubernetes/kubernetes#132083, v1.34.0"),
    ],
    "CPUManagerPolicyAlphaOptions": [
        ((1, 23), "alpha", False, False, "CHANGELOG-1.23: CPU manager policy options"),
    ],
}
VALUE_FLAGS = {
    "--config",
    "--config-dir",
    "--feature-gates",
    "--kubeconfig",
    "--bootstrap-kubeconfig",
    "--container-runtime-endpoint",
    "--pod-infra-container-image",
    "--node-labels",
    "--v",
}


def klog(level, message):
    now = datetime.datetime.now()
    sys.stderr.write(f"{level}{now:%m%d %H:%M:%S.%f} {os.getpid():7d} server.go:1] {message}\n")
    sys.stderr.flush()


def fatal(message):
    klog("E", f'"command failed" err="{message}"')
    sys.exit(1)


def read_version():
    with open(VERSION_FILE, encoding="utf-8") as handle:
        text = handle.read().strip()
    major, minor = text.split(".")[:2]
    return text, (int(major), int(minor))


def parse_args(argv):
    flags = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if not arg.startswith("--"):
            fatal(f"unknown command {arg!r} for kubelet")
        if "=" in arg:
            name, value = arg.split("=", 1)
        elif arg in VALUE_FLAGS:
            if index + 1 >= len(argv):
                fatal(f"flag needs an argument: {arg}")
            name, value = arg, argv[index + 1]
            index += 1
        else:
            name, value = arg, "true"
        flags.append((name, value))
        index += 1
    return flags


def parse_bool(text, where):
    word = text.strip().lower()
    if word in ("1", "t", "true"):
        return True
    if word in ("0", "f", "false"):
        return False
    fatal(f"invalid value of {where}: {text}, err: strconv.ParseBool: parsing {text!r}: invalid syntax")


def load_config(path):
    import yaml  # Debian's python3-yaml

    try:
        with open(path, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle.read()) or {}
    except FileNotFoundError:
        fatal(f"failed to load kubelet config file, path: {path}, error: open {path}: no such file or directory")
    except yaml.YAMLError as exc:
        fatal(f"failed to load kubelet config file, path: {path}, error: {exc}")
    if not isinstance(doc, dict):
        fatal(f"failed to load kubelet config file, path: {path}, error: not a KubeletConfiguration")
    gates = doc.get("featureGates") or {}
    for name, value in gates.items():
        if not isinstance(value, bool):
            fatal(f"failed to load kubelet config file, path: {path}, error: featureGates.{name} is not a bool")
    return gates


def stage_at(name, version):
    current = None
    for stage in GATES.get(name, []):
        if stage[0] <= version:
            current = stage
    if current is None or current[1] == "removed":
        return None
    return current


def validate(gates, version, where):
    for name, value in gates.items():
        stage = stage_at(name, version)
        if stage is None:
            fatal(f"failed to set feature gates from {where}: unrecognized feature gate: {name}")
        if stage[3] and value != stage[2]:
            fatal(
                f"failed to set feature gates from {where}: cannot set feature gate {name} to "
                f"{str(value).lower()}, feature is locked to {str(stage[2]).lower()}"
            )
        if stage[1] == "ga":
            klog("W", f"Setting GA feature gate {name}={str(value).lower()}. It will be removed in a future release.")


class Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok" if self.path == "/healthz" else b"404 page not found\n"
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def flag_gate_list(value):
    """--feature-gates A=true,B=false -> {A: True, B: False}, refused the way the kubelet's flag parser does."""
    gates = {}
    for item in value.split(","):
        if not item.strip():
            continue
        gate, sep, raw = item.partition("=")
        if not sep:
            fatal(f'invalid argument {value!r} for "--feature-gates" flag: missing bool value for {gate}')
        gates[gate.strip()] = parse_bool(raw, f"--feature-gates {gate}")
    return gates


def serve(version_text, gates, argv, ready=None):
    """Run: log, write what it runs with for the tests, call `ready` once listening, answer /healthz."""
    klog("I", f'"Kubelet version" kubeletVersion="v{version_text}"')
    klog("I", f'"Feature gates" featureGates={json.dumps(gates, sort_keys=True)}')
    server = http.server.HTTPServer(HEALTHZ, Healthz)
    os.makedirs(STATE_DIR, exist_ok=True)
    state = {"version": version_text, "feature_gates": gates, "argv": argv, "pid": os.getpid()}
    with open(os.path.join(STATE_DIR, "state.json.tmp"), "w", encoding="utf-8") as handle:
        json.dump(state, handle, sort_keys=True)
    os.replace(os.path.join(STATE_DIR, "state.json.tmp"), os.path.join(STATE_DIR, "state.json"))
    if ready:
        ready()
    server.serve_forever()


def main(argv):
    version_text, version = read_version()
    if "--version" in argv or "--version=true" in argv:
        print(f"Kubernetes v{version_text}")
        return 0
    flags = parse_args(argv)
    known = {"--config", "--config-dir", "--feature-gates"} | VALUE_FLAGS
    for name, _value in flags:
        if name == "--config-dir" and version < (1, 28):
            fatal("unknown flag: --config-dir")
        if name not in known:
            fatal(f"unknown flag: {name}")
    flag_gates = {}
    for name, value in flags:
        if name == "--feature-gates":
            flag_gates.update(flag_gate_list(value))
    validate(flag_gates, version, "initial flags-based config")
    configs = [value for name, value in flags if name == "--config"]
    dirs = [value for name, value in flags if name == "--config-dir"]
    gates = {}
    if configs:
        gates.update(load_config(configs[-1]))
    if dirs:
        if version < (1, 30) and not os.environ.get("KUBELET_CONFIG_DROPIN_DIR_ALPHA"):
            fatal("invalid configuration: --config-dir needs KUBELET_CONFIG_DROPIN_DIR_ALPHA set before 1.30")
        folder = dirs[-1]
        for entry in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if entry.endswith(".conf"):
                gates.update(load_config(os.path.join(folder, entry)))
    gates.update(flag_gates)  # flags override the config file and its drop-ins
    validate(gates, version, "config file")
    serve(version_text, gates, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A STAND-IN for the kubelet, for the molecule tests only (no kubelet can be had on the test machines).

It starts the way the real kubelet does under systemd (the package's unit, kubeadm's drop-in and its environment
files), reads the same flags (--config, --config-dir, --feature-gates, --healthz-port, --healthz-bind-address, in
either --flag=value or --flag value form), the KubeletConfiguration file (YAML, or JSON as EKS writes it: the real
kubelet reads both through sigs.k8s.io/yaml) and the drop-in folder, with flags over the files as in the real
kubelet, and validates the feature gates as the real kubelet of its version does: "unrecognized feature gate: NAME"
for a gate that version does not know, "cannot set feature gate NAME to V, feature is locked to D" for a locked one,
both fatal (exit 1). Otherwise it runs and answers /healthz where healthzBindAddress and healthzPort say (default
127.0.0.1:10248), and writes what it runs with to /run/kubelet-standin/state.json for the tests to read.

`kubelet --version` prints "Kubernetes vX.Y.Z", X.Y.Z read from /etc/kubelet-standin/version (the test writes it).
Runs on Python 3.8 and later, with Debian's python3-yaml.
"""

import datetime
import http.server
import json
import os
import sys
import time

VERSION_FILE = "/etc/kubelet-standin/version"
STATE_DIR = "/run/kubelet-standin"
HEALTHZ = ("127.0.0.1", 10248)

# What the modelled kubelet knows: gate -> [(since minor, stage, default, locked, source)]. Kept apart from the
# role's table on purpose: this one models Kubernetes, the role's decides. Both are checked against Kubernetes' own
# feature-gate history (tests/unit/kubelet_standin/fixtures/feature_gate_history.yml, from kubernetes/website).
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
    "--healthz-port",
    "--healthz-bind-address",
    "--kubeconfig",
    "--bootstrap-kubeconfig",
    "--container-runtime-endpoint",
    "--pod-infra-container-image",
    "--node-labels",
    "--v",
    # the flags of kubeadm's 1.8/1.9 drop-in (10-kubeadm.conf of that time)
    "--pod-manifest-path",
    "--network-plugin",
    "--cni-conf-dir",
    "--cni-bin-dir",
    "--cluster-dns",
    "--cluster-domain",
    "--authorization-mode",
    "--client-ca-file",
    "--cadvisor-port",
    "--cert-dir",
}
BOOL_FLAGS = {"--allow-privileged", "--rotate-certificates"}


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


def load_doc(path):
    """A KubeletConfiguration file: JSON when it reads as JSON, YAML otherwise (both are what the kubelet takes)."""
    import yaml  # Debian's python3-yaml

    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        fatal(f"failed to load kubelet config file, path: {path}, error: open {path}: no such file or directory")
    try:
        doc = json.loads(text) if text.lstrip().startswith("{") else (yaml.safe_load(text) or {})
    except (ValueError, yaml.YAMLError) as exc:
        fatal(f"failed to load kubelet config file, path: {path}, error: {exc}")
    if not isinstance(doc, dict):
        fatal(f"failed to load kubelet config file, path: {path}, error: not a KubeletConfiguration")
    gates = doc.get("featureGates") or {}
    for name, value in gates.items():
        if not isinstance(value, bool):
            fatal(f"failed to load kubelet config file, path: {path}, error: featureGates.{name} is not a bool")
    return doc


def load_config(path):
    return load_doc(path).get("featureGates") or {}


def healthz_address(docs, flags):
    """healthzBindAddress/healthzPort of the config file and its drop-ins (a later one wins), the flags over them."""
    address, port = HEALTHZ
    for doc in docs:
        address = str(doc.get("healthzBindAddress", address))
        port = int(doc.get("healthzPort", port))
    address = flags.get("--healthz-bind-address", address)
    port = int(flags.get("--healthz-port", port))
    return address, port


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


def serve(version_text, gates, argv, ready=None, healthz=HEALTHZ):
    """Run: log, write what it runs with for the tests, call `ready` once listening, answer /healthz (port 0: the
    endpoint is off, as in the kubelet)."""
    klog("I", f'"Kubelet version" kubeletVersion="v{version_text}"')
    klog("I", f'"Feature gates" featureGates={json.dumps(gates, sort_keys=True)}')
    server = http.server.HTTPServer(healthz, Healthz) if healthz[1] else None
    os.makedirs(STATE_DIR, exist_ok=True)
    state = {
        "version": version_text,
        "feature_gates": gates,
        "argv": argv,
        "pid": os.getpid(),
        "healthz": f"{healthz[0]}:{healthz[1]}",
    }
    with open(os.path.join(STATE_DIR, "state.json.tmp"), "w", encoding="utf-8") as handle:
        json.dump(state, handle, sort_keys=True)
    os.replace(os.path.join(STATE_DIR, "state.json.tmp"), os.path.join(STATE_DIR, "state.json"))
    if ready:
        ready()
    if server is None:
        while True:
            time.sleep(3600)
    server.serve_forever()


def main(argv):
    version_text, version = read_version()
    if "--version" in argv or "--version=true" in argv:
        print(f"Kubernetes v{version_text}")
        return 0
    flags = parse_args(argv)
    known = VALUE_FLAGS | BOOL_FLAGS
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
    docs = []
    if configs:
        docs.append(load_doc(configs[-1]))
    if dirs:
        if version < (1, 30) and not os.environ.get("KUBELET_CONFIG_DROPIN_DIR_ALPHA"):
            fatal("invalid configuration: --config-dir needs KUBELET_CONFIG_DROPIN_DIR_ALPHA set before 1.30")
        folder = dirs[-1]
        for entry in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if entry.endswith(".conf"):
                docs.append(load_doc(os.path.join(folder, entry)))
    gates = {}
    for doc in docs:
        gates.update(doc.get("featureGates") or {})
    gates.update(flag_gates)  # flags override the config file and its drop-ins
    validate(gates, version, "config file")
    serve(version_text, gates, argv, healthz=healthz_address(docs, dict(flags)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

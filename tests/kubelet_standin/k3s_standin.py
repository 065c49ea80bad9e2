# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A STAND-IN for k3s and rke2 (as far as their embedded kubelet goes), for the molecule tests only.

Neither can be had on the test machines (no network to their releases, and they would need a whole cluster). What
the role relies on, modelled on their documentation (k3s-io/docs installation/configuration.md; docs.rke2.io
install/configuration):

- `k3s --version` / `rke2 --version` prints "k3s version v1.30.4+k3s1 (stand-in)", the version read from
  /etc/kubelet-standin/k3s-version (or rke2-version).
- `k3s server|agent` / `rke2 server|agent` reads /etc/rancher/<name>/config.yaml (or the --config/-c file, or
  $<NAME>_CONFIG_FILE), then <config>.d/*.yaml in alphabetical order: for each key the last file wins, and a key
  ending in `+` appends to the list so far. Command-line --kubelet-arg values replace the files' list.
- Each `kubelet-arg` entry is a kubelet flag; the feature gates go through the SAME validation as the kubelet
  stand-in (kubelet_standin.py's table for the k3s version's Kubernetes minor): an unknown gate exits 1 with
  "unrecognized feature gate: NAME", a locked one set to the other value exits 1. k3s 1.32 and later also reads the
  kubelet drop-ins in /var/lib/rancher/k3s/agent/etc/kubelet.conf.d/*.conf (flags override them).
- Otherwise it tells systemd it is ready (Type=notify, as their units are), answers /healthz on 127.0.0.1:10248 (or
  where healthz-port/healthz-bind-address in kubelet-arg say) and
  writes what its kubelet runs with to /run/kubelet-standin/state.json, like the kubelet stand-in.
"""

import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kubelet_standin as ks  # the kubelet stand-in next to this file

KUBELET_DROPINS = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d"


def read_version(name):
    with open(f"/etc/kubelet-standin/{name}-version", encoding="utf-8") as handle:
        text = handle.read().strip()
    core = text.lstrip("v").split("+")[0]
    major, minor = core.split(".")[:2]
    return text, core, (int(major), int(minor))


def load_yaml(path):
    import yaml  # Debian's python3-yaml

    try:
        with open(path, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle.read())
    except yaml.YAMLError as exc:
        ks.fatal(f"failed to parse {path}: {exc}")
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        ks.fatal(f"failed to parse {path}: not a mapping")
    return doc


def as_list(value):
    if value is None:
        return []
    return [str(item) for item in value] if isinstance(value, list) else [str(value)]


def merged_config(path):
    """config.yaml then <config>.d/*.yaml, alphabetically: the last value of a key wins, `key+` appends."""
    files = [path] if os.path.exists(path) else []
    folder = path + ".d"
    if os.path.isdir(folder):
        files += [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".yaml")]
    merged = {}
    for file in files:
        for key, value in load_yaml(file).items():
            if key.endswith("+"):
                merged[key[:-1]] = as_list(merged.get(key[:-1])) + as_list(value)
            else:
                merged[key] = value
    return merged


def notify_ready():
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(b"READY=1")


def main(name, argv):
    version_text, core, version = read_version(name)
    if not argv or argv[0] in ("--version", "-v", "version"):
        print(f"{name} version {version_text} (stand-in)\ngo version go1.22.5")
        return 0
    if argv[0] not in ("server", "agent"):
        ks.fatal(f"{name}: unknown command {argv[0]!r}")
    config = os.environ.get(f"{name.upper()}_CONFIG_FILE", f"/etc/rancher/{name}/config.yaml")
    cli_args = []
    rest = argv[1:]
    index = 0
    while index < len(rest):
        flag, sep, value = rest[index].partition("=")
        if flag in ("--config", "-c", "--kubelet-arg") and not sep and index + 1 < len(rest):
            value = rest[index + 1]
            index += 1
        if flag in ("--config", "-c"):
            config = value
        elif flag == "--kubelet-arg":
            cli_args.append(value)
        index += 1
    kubelet_args = cli_args or as_list(merged_config(config).get("kubelet-arg"))
    flags = ["--" + arg.lstrip("-") for arg in kubelet_args]
    flag_gates = {}
    for flag in flags:
        gate_flag, sep, value = flag.partition("=")
        if gate_flag == "--feature-gates" and sep:
            flag_gates.update(ks.flag_gate_list(value))
    ks.validate(flag_gates, version, "initial flags-based config")
    docs = []
    if name == "k3s" and version >= (1, 32) and os.path.isdir(KUBELET_DROPINS):
        for entry in sorted(os.listdir(KUBELET_DROPINS)):
            if entry.endswith(".conf"):
                docs.append(ks.load_doc(os.path.join(KUBELET_DROPINS, entry)))
    gates = {}
    for doc in docs:
        gates.update(doc.get("featureGates") or {})
    gates.update(flag_gates)
    ks.validate(gates, version, "config file")
    flag_values = dict(flag.partition("=")[::2] for flag in flags if "=" in flag)
    ks.serve(core, gates, flags, ready=notify_ready, healthz=ks.healthz_address(docs, flag_values))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))

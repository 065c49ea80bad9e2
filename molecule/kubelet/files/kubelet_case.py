# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test helper run on the molecule nodes (Python 3.8+), one command per step to keep the scenario fast.

seed CASE_JSON   put the node in the state a case describes: the kubelet version, kubeadm's drop-in for the style
                 (flags: no config file, as before kubeadm 1.10; kubeadm; configdir: also --config-dir; dropin: the
                 case's own drop-in text, such as kubeadm 1.8's), the files (config_path, env_texts: the exact text
                 of an environment file, null to remove it), and start the kubelet through systemd (it stays down
                 when its files hold a gate its version refuses);
                 styles k3s and rke2: the kubelet unit stopped, the (stand-in) k3s or rke2 version, config.yaml and
                 config.yaml.d, k3s' kubelet.conf.d, and their unit enabled and started
observe [UNIT]   print what a user would look at, as JSON: systemd's word for UNIT (kubelet), /healthz (where the
                 stand-in says it listens), what the (stand-in) kubelet runs with, and the SHA-1 of every file the
                 kubelet reads ("absent" for a missing one) and of every file under /etc/rancher and k3s'
                 kubelet.conf.d
"""

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request

DROPIN_TEMPLATE = "/usr/lib/kubelet-standin/10-kubeadm.conf"
DROPIN = "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"
STATE = "/run/kubelet-standin/state.json"
FILES = {
    "config": "/var/lib/kubelet/config.yaml",
    "json_config": "/etc/kubernetes/kubelet/kubelet-config.json",
    "kubeadm_args": "/var/lib/kubelet/kubeadm-flags.env",
    "extra_args": "/etc/default/kubelet",
    "dropin": "/etc/kubernetes/kubelet.conf.d/50-gpu.conf",
    "unit_dropin": DROPIN,
    "marker": "/opt/kops/conf/kube_env.yaml",
}
CONFIG_ARGS = {
    "flags": "",
    "kubeadm": "--config=/var/lib/kubelet/config.yaml",
    "configdir": "--config=/var/lib/kubelet/config.yaml --config-dir=/etc/kubernetes/kubelet.conf.d",
}
K3S_KUBELET_DROPINS = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d"
EMBEDDED_UNITS = {"k3s": "k3s.service", "rke2": "rke2-server.service"}
DEFAULT_KUBEADM_ARGS = "--container-runtime-endpoint=unix:///run/containerd/containerd.sock"


def systemctl(*args):
    subprocess.run(["systemctl", *args], check=True)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if text is None:
        if os.path.exists(path):
            os.remove(path)
        return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o644)


def healthz():
    """GET /healthz where the (stand-in) kubelet says it listens (its healthzPort/healthzBindAddress), else 10248."""
    address = "127.0.0.1:10248"
    if os.path.exists(STATE):
        with open(STATE, encoding="utf-8") as handle:
            address = json.load(handle).get("healthz", address)
    try:
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=2) as answer:
            return f"{answer.status} {answer.read().decode()}"
    except OSError as exc:
        return f"-1 {exc}"


def seed_embedded(case):
    """A k3s or rke2 node: its kubelet runs inside the k3s/rke2 process, configured by kubelet-arg."""
    name = case["style"]
    unit = EMBEDDED_UNITS[name]
    systemctl("stop", "kubelet")
    systemctl("disable", "kubelet")
    for other in EMBEDDED_UNITS.values():  # one kubelet per node: the others stop
        subprocess.run(["systemctl", "stop", other], check=False)
        subprocess.run(["systemctl", "disable", other], check=False)
    if os.path.exists(STATE):
        os.remove(STATE)
    write(FILES["marker"], None)
    if os.path.isdir(K3S_KUBELET_DROPINS):
        for entry in os.listdir(K3S_KUBELET_DROPINS):
            os.remove(os.path.join(K3S_KUBELET_DROPINS, entry))
    for entry, text in (case.get("kubelet_dropins") or {}).items():
        write(os.path.join(K3S_KUBELET_DROPINS, entry), text)
    write(f"/etc/kubelet-standin/{name}-version", f"v{case['version']}+{name}1\n")
    folder = f"/etc/rancher/{name}"
    if os.path.isdir(folder + "/config.yaml.d"):
        for entry in os.listdir(folder + "/config.yaml.d"):
            os.remove(os.path.join(folder, "config.yaml.d", entry))
    write(folder + "/config.yaml", case.get("config"))
    for entry, text in (case.get("dropins") or {}).items():
        write(os.path.join(folder, "config.yaml.d", entry), text)
    systemctl("daemon-reload")
    subprocess.run(["systemctl", "reset-failed", unit], check=False)  # refused for a unit never loaded yet
    systemctl("enable", unit)
    subprocess.run(["systemctl", "start", unit], check=False)  # it stays down when kubelet-arg holds a refused gate


def seed(case):
    if case["style"] in EMBEDDED_UNITS:
        seed_embedded(case)
        return
    systemctl("stop", "kubelet")
    if os.path.exists(STATE):
        os.remove(STATE)
    write("/etc/kubelet-standin/version", case["version"] + "\n")
    if case["style"] == "dropin":
        write(DROPIN, case["dropin_text"])
    else:
        with open(DROPIN_TEMPLATE, encoding="utf-8") as handle:
            template = handle.read()
        config_args = CONFIG_ARGS[case["style"]]
        if case.get("config_path"):
            config_args = config_args.replace(FILES["config"], case["config_path"])
        write(
            DROPIN,
            template.replace(
                "KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml", "KUBELET_CONFIG_ARGS=" + config_args
            ),
        )
    for path in (FILES["config"], FILES["json_config"]):
        write(path, None)
    write(case.get("config_path") or FILES["config"], case.get("config"))
    write(FILES["kubeadm_args"], f'KUBELET_KUBEADM_ARGS="{case.get("kubeadm_args", DEFAULT_KUBEADM_ARGS)}"\n')
    extra = case.get("extra_args")
    write(FILES["extra_args"], None if extra is None else f"KUBELET_EXTRA_ARGS={extra}\n")
    for path, text in (case.get("env_texts") or {}).items():
        write(path, text)
    write(FILES["dropin"], case.get("dropin"))
    write(FILES["marker"], "ClusterName: gpu.example.org\n" if case.get("marker") else None)
    systemctl("daemon-reload")
    systemctl("reset-failed", "kubelet")
    systemctl("start", "kubelet")
    for _attempt in range(10):  # a kubelet that starts answers within a second or two
        if healthz().startswith("200"):
            break
        time.sleep(1)


def observe(unit):
    active = subprocess.run(["systemctl", "is-active", unit], stdout=subprocess.PIPE, check=False)
    state = {}
    if os.path.exists(STATE):
        with open(STATE, encoding="utf-8") as handle:
            state = json.load(handle)
    sums = {}
    for name, path in FILES.items():
        if os.path.exists(path):
            with open(path, "rb") as handle:
                sums[name] = hashlib.sha1(handle.read()).hexdigest()
        else:
            sums[name] = "absent"
    for top in ("/etc/rancher", K3S_KUBELET_DROPINS):
        for folder, _dirs, names in os.walk(top):
            for name in names:
                with open(os.path.join(folder, name), "rb") as handle:
                    sums[os.path.join(folder, name)] = hashlib.sha1(handle.read()).hexdigest()
    print(json.dumps({"active": active.stdout.decode().strip(), "healthz": healthz(), "state": state, "sums": sums}))


if __name__ == "__main__":
    if sys.argv[1] == "seed":
        seed(json.loads(sys.argv[2]))
    else:
        observe(sys.argv[2] if len(sys.argv) > 2 else "kubelet")

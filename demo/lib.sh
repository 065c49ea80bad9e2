# shellcheck shell=bash
# What demo/run.sh and bench/fleet share: the containers that stand in for GPU nodes, the key site.yml logs in with,
# the signed stand-ins of NVIDIA's repositories (tests/aptrepo), the simulated API server (tests/kubesim) and
# demo/prepare.yml. Source it with $root set to the repository; the caller's PATH and CONTAINERS_CONF are make's
# (see the Makefile). Each function says what it leaves behind; the caller removes it (demo_stop_repos, kill).

# shellcheck disable=SC2154 # root: set by the script that sources this file
demo_tests_python() { PYTHONPATH="$root/tests${PYTHONPATH:+:$PYTHONPATH}" python "$@"; }

# demo_start_node NAME ADDRESS IMAGE: a container standing in for a GPU node, at ADDRESS on podman's network (empty:
# an address podman picks, which demo_address reads; it may change when the container restarts).
# --restart always: `systemctl reboot` inside brings the container back, as a reboot does a host, at the same --ip.
# /sys/module is a tmpfs that demo/prepare.yml fills, as the kernel would, with the nvidia module "loaded".
demo_start_node() {
  podman run -d --name "$1" --hostname "$1" ${2:+--ip "$2"} --systemd=always --restart always \
    --mount type=tmpfs,destination=/sys/module,notmpcopyup "$3" /sbin/init >/dev/null
}

# demo_address NAME: the container's address on podman's network.
demo_address() { podman inspect -f '{{.NetworkSettings.IPAddress}}' "$1"; }

# demo_ssh_key DIR: a new key pair DIR/id_ed25519 (DIR is made afresh) for site.yml to log in with.
demo_ssh_key() {
  rm -rf "$1" && mkdir -m 0700 "$1"
  ssh-keygen -q -t ed25519 -N '' -C kubegpu-demo -f "$1/id_ed25519"
}

# demo_serve_repos WORK: builds and serves the signed stand-ins of NVIDIA's CUDA and Container Toolkit repositories
# under WORK/aptrepo, and writes WORK/chain-vars.json, the role variables that point site.yml at them.
demo_serve_repos() {
  local work=$1 repo
  mkdir -p "$work/aptrepo"
  for repo in cuda-driver nvidia-container-toolkit; do
    rm -rf "${work:?}/aptrepo/$repo"
    demo_tests_python -m aptrepo build "$root/tests/aptrepo/specs/$repo.yml" "$work/aptrepo/$repo/root" \
      >"$work/aptrepo/$repo.keys.json"
    demo_tests_python -m aptrepo serve start "$work/aptrepo/$repo/root" "$work/aptrepo/$repo/state" \
      >"$work/aptrepo/$repo.server.json"
  done
  python - "$work" >"$work/chain-vars.json" <<'PYTHON'
import json, sys
work = sys.argv[1]
def load(name):
    return json.load(open(f"{work}/aptrepo/{name}"))
cuda_url = "http://host.containers.internal:%d" % load("cuda-driver.server.json")["port"]
toolkit_url = "http://host.containers.internal:%d" % load("nvidia-container-toolkit.server.json")["port"]
cuda_path = "compute/cuda/repos/debian12/x86_64"
print(json.dumps({
    "nvidia_driver_repository_url": f"{cuda_url}/current/{cuda_path}/",
    "nvidia_driver_repository_key_url": f"{cuda_url}/good/{cuda_path}/3bf863cc.pub",
    "nvidia_driver_repository_key_fingerprints": [load("cuda-driver.keys.json")["good"]],
    "nvidia_container_toolkit_repo_url": f"{toolkit_url}/current/libnvidia-container",
    "nvidia_container_toolkit_repo_key_fingerprints": [load("nvidia-container-toolkit.keys.json")["good"]],
}, indent=2))
PYTHON
}

# demo_stop_repos WORK: stops the servers demo_serve_repos started (quietly, for traps).
demo_stop_repos() {
  local repo
  for repo in cuda-driver nvidia-container-toolkit; do
    if [ -d "$1/aptrepo/$repo/state" ]; then
      demo_tests_python -m aptrepo serve stop "$1/aptrepo/$repo/state" >/dev/null 2>&1 || true
    fi
  done
}

# demo_start_kubesim WORK KUBESIM-ARGS...: the simulated API server in the background (log WORK/kubesim.log), with a
# kubeconfig at WORK/kubeconfig. Sets demo_sim_pid (the caller kills it) and demo_sim_url, and exports KUBECONFIG.
demo_start_kubesim() {
  local work=$1
  shift
  rm -f "$work/kubeconfig"
  # Python itself in the background (not a function in a subshell), so that demo_sim_pid is the server's.
  PYTHONPATH="$root/tests${PYTHONPATH:+:$PYTHONPATH}" python -m kubesim --tls --port 0 --kubeconfig "$work/kubeconfig" \
    "$@" >"$work/kubesim.log" 2>&1 &
  # shellcheck disable=SC2034 # for the caller
  demo_sim_pid=$!
  for _ in $(seq 50); do [ -s "$work/kubeconfig" ] && break; sleep 0.2; done
  [ -s "$work/kubeconfig" ] \
    || { echo "the simulated API server did not start:" >&2; cat "$work/kubesim.log" >&2; return 1; }
  export KUBECONFIG="$work/kubeconfig"
  # shellcheck disable=SC2034 # for the caller
  demo_sim_url=$(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')
}

# demo_prepare WORK INVENTORY NODE [ANSIBLE-PLAYBOOK-ARGS...]: demo/prepare.yml on the inventory's gpu_nodes
# (through podman first: sshd, the key WORK/ssh/id_ed25519.pub allowed for root, the host keys read into
# WORK/ssh/known_hosts; then over SSH), log WORK/prepare.log. Then adds to WORK/chain-vars.json the Debian kernel whose
# headers prepare installed in the container NODE, which DKMS builds the driver for (the host's kernel is not Debian's).
demo_prepare() {
  local work=$1 inventory=$2 node=$3 kernel
  shift 3
  ansible-playbook -i "$inventory" "$root/demo/prepare.yml" \
    -e "demo_ssh_public_key='$(cat "$work/ssh/id_ed25519.pub")'" \
    -e "demo_known_hosts=$work/ssh/known_hosts" "$@" >"$work/prepare.log" || { cat "$work/prepare.log"; return 1; }
  kernel=$(podman exec "$node" sh -c 'ls /lib/modules | grep -- -amd64 | sort -V | tail -n 1')
  python - "$work/chain-vars.json" "$kernel" <<'PYTHON'
import json, sys
path, kernel = sys.argv[1], sys.argv[2]
data = json.load(open(path))
data["nvidia_driver_kernels"] = [kernel]
json.dump(data, open(path, "w"), indent=2)
PYTHON
}

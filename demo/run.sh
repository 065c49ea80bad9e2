#!/usr/bin/env bash
# The demo: two podman containers stand in for GPU nodes (no GPU in them), a simulated Kubernetes API server stands in
# for the cluster, and playbooks/site.yml makes the nodes GPU-ready, then shows what changed.
#   demo/run.sh          run it (containers and the simulated API server are removed afterwards)
#   KEEP=1 demo/run.sh   leave the containers running to look around (podman exec -it kubegpu-demo-node-1 bash)
#   demo/run.sh --clean  remove leftover demo containers
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
nodes=(kubegpu-demo-node-1 kubegpu-demo-node-2)
work="$root/.tmp/demo"
image=${DEMO_IMAGE:-kubegpu-node-test:bookworm}

clean_containers() { podman rm -f "${nodes[@]}" >/dev/null 2>&1 || true; }
if [ "${1:-}" = "--clean" ]; then clean_containers; exit 0; fi

mkdir -p "$work"
sim_pid=""
finish() {
  if [ -n "$sim_pid" ]; then kill "$sim_pid" 2>/dev/null || true; fi
  [ "${KEEP:-0}" = 1 ] || clean_containers
}
trap finish EXIT

echo "== Starting ${#nodes[@]} containers that stand in for GPU nodes ($image)"
clean_containers
for n in "${nodes[@]}"; do
  podman run -d --name "$n" --hostname "$n" --systemd=always "$image" /sbin/init >/dev/null
done

echo "== Starting the simulated Kubernetes API server (tests/kubesim, a stand-in for a real cluster)"
rm -f "$work/kubeconfig"
PYTHONPATH="$root/tests${PYTHONPATH:+:$PYTHONPATH}" python -m kubesim --tls --port 0 --kubeconfig "$work/kubeconfig" \
  --node kubegpu-demo-node-1=8 --node kubegpu-demo-node-2=4 --capacity-delay 2 --capacity-spread 2 \
  >"$work/kubesim.log" 2>&1 &
sim_pid=$!
for _ in $(seq 50); do [ -s "$work/kubeconfig" ] && break; sleep 0.2; done
[ -s "$work/kubeconfig" ] || { echo "the simulated API server did not start:" >&2; cat "$work/kubesim.log" >&2; exit 1; }
export KUBECONFIG="$work/kubeconfig"
kubectl get nodes -o custom-columns='NODE:.metadata.name,GPUS:.status.capacity.nvidia\.com/gpu'

echo "== Installing containerd and the stand-ins (nvidia-container-runtime, nvidia-smi, the driver's facts) in the containers"
ansible-playbook -i demo/inventory.yml demo/prepare.yml >"$work/prepare.log" || { cat "$work/prepare.log"; exit 1; }

echo "== A training job runs on node 1, under a PodDisruptionBudget"
kubectl apply -f demo/workload/
kubectl get pods -o wide

echo "== ansible-playbook kubegpu.node.site --diff"
start=$(date +%s)
ansible-playbook -i demo/inventory.yml kubegpu.node.site --diff -e "kubegpu_kubeconfig=$work/kubeconfig" \
  ${DEMO_VERBOSE:+-vvv} | tee "$work/first-run.log"
echo "== First converge: $(( $(date +%s) - start )) s"

echo "== What changed on the nodes"
for n in "${nodes[@]}"; do
  echo "-- $n: containerd's effective configuration (containerd config dump), nvidia runtime and default runtime"
  podman exec "$n" sh -c 'containerd config dump 2>/dev/null' \
    | grep -E 'default_runtime_name|runtimes\.nvidia\]|BinaryName = ".*nvidia' || true
done
echo "-- the cluster: nvidia.com/gpu capacity per node, as kubectl sees it"
kubectl get nodes -o custom-columns='NODE:.metadata.name,GPUS:.status.capacity.nvidia\.com/gpu,ALLOCATABLE:.status.allocatable.nvidia\.com/gpu'
echo "-- the GPU labels (the names GPU feature discovery uses), and node 1 schedulable again after its drain"
kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/gpu.memory,nvidia.com/cuda.driver-version.full
echo "-- the training job was evicted from node 1 before containerd restarted under it (its events)"
kubectl get pods -o wide
kubectl -n kube-system get daemonset nvidia-device-plugin-daemonset

echo "== Running it again: nothing should change, nothing is drained"
start=$(date +%s)
ansible-playbook -i demo/inventory.yml kubegpu.node.site -e "kubegpu_kubeconfig=$work/kubeconfig" \
  ${DEMO_VERBOSE:+-vvv} >"$work/second-run.log"
echo "== No-op re-run: $(( $(date +%s) - start )) s"
tail -n 6 "$work/second-run.log"
if grep -Eq 'changed=[1-9]|failed=[1-9]' "$work/second-run.log" || grep -q 'Cordon and drain node' "$work/second-run.log"; then
  echo "== The second run changed something (see $work/second-run.log)" >&2
  exit 1
fi
echo "== Second run: no changes"

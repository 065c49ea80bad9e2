#!/usr/bin/env bash
# The demo: two podman containers stand in for GPU nodes (no GPU in them), a simulated Kubernetes API server stands in
# for the cluster, two signed stand-in package repositories (tests/aptrepo) for NVIDIA's CUDA and toolkit
# repositories, and playbooks/site.yml makes the nodes GPU-ready, then shows what changed.
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

# shellcheck source=demo/lib.sh
. "$root/demo/lib.sh"
mkdir -p "$work"
demo_sim_pid=""
watch_pid=""
run_pid=""
finish() {
  if [ -n "$run_pid" ]; then kill "$run_pid" 2>/dev/null || true; fi
  if [ -n "$watch_pid" ]; then kill "$watch_pid" 2>/dev/null || true; fi
  if [ -n "$demo_sim_pid" ]; then kill "$demo_sim_pid" 2>/dev/null || true; fi
  demo_stop_repos "$work"
  [ "${KEEP:-0}" = 1 ] || clean_containers
}
trap finish EXIT

echo "== Starting ${#nodes[@]} containers that stand in for GPU nodes ($image)"
clean_containers
# Each node at its address in demo/inventory.yml (site.yml reaches the nodes over SSH there).
inventory_address() {
  python -c 'import sys, yaml
print(yaml.safe_load(open("demo/inventory.yml"))["all"]["children"]["gpu_nodes"]["hosts"][sys.argv[1]]["ansible_host"])' "$1"
}
for n in "${nodes[@]}"; do demo_start_node "$n" "$(inventory_address "$n")" "$image"; done
demo_ssh_key "$work/ssh"

echo "== Serving signed stand-ins of NVIDIA's CUDA and Container Toolkit repositories (tests/aptrepo)"
demo_serve_repos "$work"

echo "== Starting the simulated Kubernetes API server (tests/kubesim, a stand-in for a real cluster)"
demo_start_kubesim "$work" --node kubegpu-demo-node-1=8 --node kubegpu-demo-node-2=4 --capacity-delay 2 \
  --capacity-spread 2
sim_url=$demo_sim_url
# Each task's time, and the slowest tasks at the end of each run's log (bench/RESULTS.md uses them).
export ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks
kubectl get nodes -o custom-columns='NODE:.metadata.name,GPUS:.status.capacity.nvidia\.com/gpu'

echo "== Installing containerd, kernel headers and the stand-ins (kubelet, nvidia-smi, a loaded driver) in the containers"
# It installs sshd, allows the key and writes the nodes' host keys to known_hosts, read through podman rather than
# trusted on first use over the network; then prepares the rest over SSH; DKMS builds the driver for the Debian
# kernel whose headers it installed (the host's kernel is not Debian's).
demo_prepare "$work" demo/inventory.yml "${nodes[0]}"

# A node's kubelet posts a new boot ID when its machine reboots: this watcher tells the simulated API server when a
# node's container started again (a stand-in for that kubelet's status). One `podman inspect` of every node every
# 3 s (about 47 ms of CPU each, bench/RESULTS.md: once a second cost about 47 CPU-seconds over a 1,000 s demo on a
# loaded machine). The drain window waits up to kubegpu_node_ready_timeout (60 s, demo/inventory.yml) for a new boot ID
# and Ready; the poll adds at most 3 s to it. Not `podman events`: with podman's file event log it replays old start
# events when the log rotates, which would reboot nodes in the simulator that did not reboot.
(
  declare -A started
  while read -r n at; do started[$n]=$at; done < <(podman inspect -f '{{.Name}} {{.State.StartedAt}}' "${nodes[@]}")
  while sleep 3; do
    while read -r n at; do
      if [ "$at" != "${started[$n]}" ]; then
        started[$n]=$at
        curl -sk -X POST -H "Authorization: Bearer test-token" -H 'Content-Type: application/json' \
          -d "{\"method\": \"reboot_node\", \"args\": [\"$n\", 3.0]}" "$sim_url/kubesim/control" >/dev/null || true
      fi
    done < <(podman inspect -f '{{.Name}} {{.State.StartedAt}}' "${nodes[@]}" 2>/dev/null)
  done
) &
watch_pid=$!

echo "== A training job runs on node 1, under a PodDisruptionBudget"
kubectl apply -f demo/workload/
kubectl get pods -o wide

echo "== ansible-playbook kubegpu.node.site --check --diff: what it would do, changing nothing (log: $work/check-run.log)"
start=$(date +%s)
ansible-playbook -i demo/inventory.yml kubegpu.node.site --check --diff -e "kubegpu_kubeconfig=$work/kubeconfig" \
  -e "@$work/chain-vars.json" ${DEMO_VERBOSE:+-vvv} >"$work/check-run.log" || { tail -n 60 "$work/check-run.log"; exit 1; }
echo "== Check mode: $(( $(date +%s) - start )) s"
grep -E 'would (cordon|apply)' "$work/check-run.log" | sed 's/^ *"msg": //' || true
sed -n '/PLAY RECAP/,/^$/p' "$work/check-run.log"
grep -q 'would cordon and drain node kubegpu-demo-node-1, then apply what was held back (reboot' "$work/check-run.log" \
  || { echo "== Check mode did not say that node 1 needs a drain window and a reboot" >&2; exit 1; }
for n in "${nodes[@]}"; do
  if podman exec "$n" test -e /usr/bin/nvidia-container-runtime \
    || { [ "$n" = "${nodes[0]}" ] && [ "$(podman exec "$n" cat /sys/module/nvidia/version)" = 580.95.05 ]; } \
    || [ "$(kubectl get node "$n" -o jsonpath='{.spec.unschedulable}')" = true ]; then
    echo "== Check mode changed $n" >&2; exit 1
  fi
done

# What a user checks; the demo fails when one of them is not so (tests/README.md: the demo is CI's end-to-end test of
# site.yml's chain).
failures=()
expect() { # DESCRIPTION ACTUAL EXPECTED
  if [ "$2" = "$3" ]; then echo "ok: $1"; else echo "NOT OK: $1: got '$2', expected '$3'"; failures+=("$1"); fi
}
cordon_record() { kubectl get node "$1" -o jsonpath='{.metadata.annotations.kubegpu\.node/cordon}'; }
# Waits for the simulated cluster, with room for a loaded CI machine (the checks after them say what did not happen).
# Every 2 s: each check starts curl and Python (about 125 ms of CPU), and the wait for node 1's drain lasted 607 s on a
# loaded CI machine; what is waited for stays (the simulator holds the drain open, the pods keep running).
until_within() { # SECONDS COMMAND...: run COMMAND every 2 seconds until it succeeds or SECONDS have passed
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@"; do [ "$(date +%s)" -lt "$deadline" ] || return 0; sleep 2; done
}

# AWX cancels a job with SIGTERM (then SIGKILL after a grace period). The first converge is cancelled inside node 1's
# drain window, right after the cordon: the cordon carries its record, and the next run must finish the node. The
# simulated API server keeps the drain's first request (the list of the node's pods) waiting, as a slow API server or a
# long drain would, so that the cancel lands at that point in every run of the demo.
# The simulated API server's control endpoint (tests/kubesim/README.md).
sim_call() { # METHOD [ARGS-JSON [KWARGS-JSON]]
  local args='[]' kwargs='{}'
  if [ $# -ge 2 ]; then args=$2; fi
  if [ $# -ge 3 ]; then kwargs=$3; fi
  curl -sfk -X POST -H "Authorization: Bearer test-token" -H 'Content-Type: application/json' \
    -d "{\"method\": \"$1\", \"args\": $args, \"kwargs\": $kwargs}" "$sim_url/kubesim/control"
}
sim_call hold '[]' '{"verbs": ["list"], "path_regex": "^/api/v1/pods$", "seconds": 600}' >/dev/null
echo "== ansible-playbook kubegpu.node.site --diff, cancelled with SIGTERM inside node 1's drain window (log: $work/cancelled-run.log)"
start=$(date +%s)
ansible-playbook -i demo/inventory.yml kubegpu.node.site --diff -e "kubegpu_kubeconfig=$work/kubeconfig" \
  -e "@$work/chain-vars.json" ${DEMO_VERBOSE:+-vvv} >"$work/cancelled-run.log" 2>&1 &
run_pid=$!
drain_held() { [ "$(sim_call held | python -c 'import json,sys; print(json.load(sys.stdin)["result"])')" -gt 0 ]; }
drain_held_or_run_ended() { drain_held || ! kill -0 "$run_pid" 2>/dev/null; }
until_within 1200 drain_held_or_run_ended # 20 minutes at most (about 2 on an idle 2-core machine)
record=""
if drain_held; then record=$(cordon_record "${nodes[0]}"); fi
if [ -z "$record" ]; then
  sim_call release >/dev/null
  tail -n 60 "$work/cancelled-run.log"; echo "== The run did not reach node 1's drain with the node cordoned" >&2; exit 1
fi
kill -TERM "$run_pid"
status=0
wait "$run_pid" || status=$?
run_pid=""
sim_call release >/dev/null
echo "== Cancelled after $(( $(date +%s) - start )) s (exit status $status), in: $(grep '^TASK \[' "$work/cancelled-run.log" | tail -n 1)"
echo "-- node 1 as the cancel left it: cordoned, with the record of why (annotation kubegpu.node/cordon)"
kubectl get node "${nodes[0]}" -o custom-columns='NODE:.metadata.name,UNSCHEDULABLE:.spec.unschedulable'
echo "$record"
expect "the cancelled run left node 1 cordoned" "$(kubectl get node "${nodes[0]}" -o jsonpath='{.spec.unschedulable}')" true
expect "the record says how to put node 1 back by hand" \
  "$(python -c 'import json,sys; print(json.loads(sys.argv[1])["undo"])' "$record")" \
  "kubectl uncordon ${nodes[0]} && kubectl annotate node ${nodes[0]} kubegpu.node/cordon-"
expect "the cancelled run did not reach node 2" "$(grep -c 'kubegpu-demo-node-2' <(sed -n '/^PLAY \[Make GPU nodes ready/,$p' \
  "$work/cancelled-run.log"))" 0

echo "== ansible-playbook kubegpu.node.site --diff again: it finishes node 1's window, then node 2"
start=$(date +%s)
ansible-playbook -i demo/inventory.yml kubegpu.node.site --diff -e "kubegpu_kubeconfig=$work/kubeconfig" \
  -e "@$work/chain-vars.json" \
  ${DEMO_VERBOSE:+-vvv} | tee "$work/first-run.log"
echo "== First converge, resumed: $(( $(date +%s) - start )) s"

echo "== What changed on the nodes"
for n in "${nodes[@]}"; do
  echo "-- $n"
  podman exec "$n" sh -c 'echo "driver loaded: $(cat /sys/module/nvidia/version)"; \
    echo "built by DKMS: $(modinfo -F version /lib/modules/*/updates/dkms/nvidia.ko* | head -n 1)"; \
    echo "held: $(apt-mark showhold | tr "\n" " ")"; \
    echo "nvidia-container-runtime from: $(dpkg -S /usr/bin/nvidia-container-runtime | cut -d: -f1)"; \
    echo "kubelet: $(python3 /usr/local/lib/kubelet_case.py observe)"'
  podman exec "$n" sh -c 'containerd config dump 2>/dev/null' \
    | grep -E 'default_runtime_name|runtimes\.nvidia\]|BinaryName = ".*nvidia' || true
done
echo "-- the cluster: nvidia.com/gpu capacity per node, as kubectl sees it"
kubectl get nodes -o custom-columns='NODE:.metadata.name,GPUS:.status.capacity.nvidia\.com/gpu,ALLOCATABLE:.status.allocatable.nvidia\.com/gpu'
echo "-- the GPU labels (the names GPU feature discovery uses), and node 1 schedulable again after its drain"
kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/gpu.memory,nvidia.com/cuda.driver-version.full
echo "-- the training job was evicted from node 1 before the node rebooted into its new driver"
kubectl get pods -o wide
kubectl -n kube-system get daemonset nvidia-device-plugin-daemonset dcgm-exporter
echo "-- GPU health: node 2 has a GPU with an uncorrectable ECC error (labelled, and tainted: kubegpu_gpu_health_taint)"
kubectl get nodes \
  -o custom-columns='NODE:.metadata.name,HEALTH:.metadata.labels.kubegpu\.node/gpu-health,ACTION:.metadata.labels.kubegpu\.node/gpu-health-action,TAINTS:.spec.taints[*].key'

echo "== Checking the result"
for n in "${nodes[@]}"; do
  expect "$n runs driver 580.95.05" "$(podman exec "$n" cat /sys/module/nvidia/version)" 580.95.05
  expect "$n's driver packages are held" "$(podman exec "$n" apt-mark showhold | grep -c '^nvidia-kernel-dkms$')" 1
  expect "$n's nvidia-container-runtime comes from the toolkit package" \
    "$(podman exec "$n" dpkg -S /usr/bin/nvidia-container-runtime | cut -d: -f1)" nvidia-container-toolkit-base
  kubelet=$(podman exec "$n" python3 /usr/local/lib/kubelet_case.py observe)
  expect "$n's kubelet answers /healthz" \
    "$(python -c 'import json,sys; print(json.loads(sys.argv[1])["healthz"])' "$kubelet")" "200 ok"
  expect "$n's kubelet runs without DevicePlugins" \
    "$(python -c 'import json,sys; print("DevicePlugins" in json.loads(sys.argv[1])["state"].get("feature_gates", {}))' "$kubelet")" False
  expect "$n is labelled with its GPU model" \
    "$(kubectl get node "$n" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.product}')" NVIDIA-A100-SXM4-80GB
  expect "$n is labelled with its driver" \
    "$(kubectl get node "$n" -o jsonpath='{.metadata.labels.nvidia\.com/cuda\.driver-version\.full}')" 580.95.05
  expect "$n is schedulable" "$(kubectl get node "$n" -o jsonpath='{.spec.unschedulable}' | sed 's/^false$//')" ""
  expect "$n carries no cordon record" "$(cordon_record "$n")" ""
done
expect "the training job was evicted from node 1" "$(kubectl get pods -o name | grep -c '^pod/training-0$')" 0
expect "node 1 was rebooted into its new driver, node 2 not" \
  "$(sed -n '/^TASK \[kubegpu.node.nvidia_driver : Reboot into the installed driver\]/,/^TASK \[/p' "$work/first-run.log" \
     | grep -o '^changed: \[kubegpu-demo-node-[0-9]\]' | tr '\n' ' ')" "changed: [kubegpu-demo-node-1] "
# Both nodes ran a container (the shim stand-in) that a containerd restart would kill, so both restarts were held back
# for a drain window: node 1's ended in its reboot, node 2's in containerd's restart. containerd logs the
# configuration its CRI plugin runs with when it starts: the line of the process running now must name nvidia.
# Node 1's window was resumed from the cancelled run's cordon (its record there already); node 2's opened in this run.
# Each ended in the uncordon of a cordon with its record.
expect "node 1's window resumed the cordon the cancelled run left, node 2's cordoned it" \
  "$(sed -n '/^TASK \[Cordon the node, with a record of why/,/^TASK \[/p' "$work/first-run.log" \
     | grep -Eo '^(ok|changed): \[kubegpu-demo-node-[0-9]' | tr '\n' ' ')" \
  "ok: [kubegpu-demo-node-1 changed: [kubegpu-demo-node-2 "
expect "both nodes were uncordoned with their record removed" "$(grep -Ec '^changed: \[kubegpu-demo-node-[0-9] -> localhost\]' \
  <(sed -n '/^TASK \[Uncordon the node when the cordon is this collection/,/^TASK \[/p' "$work/first-run.log"))" 2
declare -A containerd_pid
for n in "${nodes[@]}"; do
  containerd_pid[$n]=$(podman exec "$n" systemctl show -p MainPID --value containerd)
  expect "$n's running containerd has nvidia as its default runtime" "$(podman exec "$n" sh -c \
    "journalctl _PID=${containerd_pid[$n]} -o cat --no-pager | grep -c 'Start cri plugin with config.*DefaultRuntimeName:nvidia '")" 1
  expect "$n has no runtime restart left pending" \
    "$(podman exec "$n" sh -c 'ls /var/lib/kubegpu/container_runtime/pending/ 2>/dev/null | wc -l')" 0
done
expect "the validation table says ok for every node" "$(grep -Ec 'kubegpu-demo-node-[12] .*FAILED' "$work/first-run.log")" 0
# GPU health: node 2's GPU 2 has an uncorrectable ECC error (its stand-in nvidia-smi says so).
expect "node 2 is labelled with its failed GPU" \
  "$(kubectl get node "${nodes[1]}" -o jsonpath='{.metadata.labels.kubegpu\.node/gpu-health}')" failed
expect "node 2 is tainted for it" \
  "$(kubectl get node "${nodes[1]}" -o jsonpath='{.spec.taints[?(@.key=="kubegpu.node/gpu-unhealthy")].value}')" failed
expect "node 1 carries no GPU health mark" \
  "$(kubectl get node "${nodes[0]}" -o jsonpath='{.metadata.labels.kubegpu\.node/gpu-health}{.spec.taints}')" ""
expect "the validation table shows node 2's GPU health" \
  "$(grep -Ec 'kubegpu-demo-node-2 .*failed \(reset\): GPU 2' "$work/first-run.log")" 1
expect "the DCGM exporter runs on both nodes" \
  "$(kubectl -n kube-system get daemonset dcgm-exporter -o jsonpath='{.status.numberReady}')" 2
kubectl apply -f - >/dev/null <<'POD'
apiVersion: v1
kind: Pod
metadata: {name: gpu-job, namespace: default}
spec:
  containers:
    - {name: job, image: registry.example/training:1, resources: {limits: {nvidia.com/gpu: "1"}}}
POD
gpu_job_placed() { [ -n "$(kubectl get pod gpu-job -o jsonpath='{.spec.nodeName}')" ]; }
until_within 120 gpu_job_placed
expect "a new GPU workload lands on node 1" "$(kubectl get pod gpu-job -o jsonpath='{.spec.nodeName}')" "${nodes[0]}"
# Gone before the no-op re-run, whose validation still asks for all of a node's GPUs.
kubectl delete pod gpu-job --wait=false >/dev/null
# The toolkit's plan: a full read per node in site.yml's preflight play, the node's read in its batch, and one more
# after apt installed the packages. The cancelled run planned both nodes and ran node 1's batch (installing); the
# resumed run planned both, re-read node 1 (nothing to install) and ran node 2's batch (installing).
expect "the toolkit planned from the preflight's read, then from the node's (cancelled run)" "$(sed -n \
  '/^TASK \[kubegpu.node.nvidia_container_toolkit : Plan the toolkit from the node as it is/,/^TASK \[/p' \
  "$work/cancelled-run.log" | grep -c '^ok: ')" 4
expect "the toolkit planned from the preflight's read, then from the node's (resumed run)" "$(sed -n \
  '/^TASK \[kubegpu.node.nvidia_container_toolkit : Plan the toolkit from the node as it is/,/^TASK \[/p' \
  "$work/first-run.log" | grep -c '^ok: ')" 5
[ ${#failures[@]} -eq 0 ] || { echo "== The demo's checks failed: ${failures[*]}" >&2; exit 1; }

# The simulated API server's own record of what was created and preempted (tests/kubesim: creations, preemptions).
pods_created() { sim_call creations '["pods"]' | python -c 'import json, sys; print(len(json.load(sys.stdin)["result"]))'; }
workload() { kubectl get pod inference-0 -o jsonpath='{.metadata.uid} {.status.phase}'; }

echo "== A GPU workload takes all four GPUs of node 2"
kubectl apply -f demo/busy/
workload_running() { [ "$(workload | cut -d' ' -f2)" = Running ]; }
until_within 120 workload_running
workload_before=$(workload)
expect "the workload on node 2 runs" "$(workload | cut -d' ' -f2)" Running
kubectl get pods -o wide

echo "== Running it again while node 2 is busy: nothing should change, nothing is drained, no pod is started"
created_before=$(pods_created)
start=$(date +%s)
ansible-playbook -i demo/inventory.yml kubegpu.node.site -e "kubegpu_kubeconfig=$work/kubeconfig" \
  -e "@$work/chain-vars.json" \
  ${DEMO_VERBOSE:+-vvv} >"$work/second-run.log"
echo "== No-op re-run: $(( $(date +%s) - start )) s"
tail -n 6 "$work/second-run.log"
# Judged per host from the recap: every node in it, none changed, failed or unreachable (tests/ansible_recap.py).
if ! python tests/ansible_recap.py --unchanged "$work/second-run.log" "${nodes[@]}" \
    || grep -q 'Drain window for' "$work/second-run.log"; then
  echo "== The second run changed something (see $work/second-run.log)" >&2
  exit 1
fi
expect "the second run started no pod" "$(( $(pods_created) - created_before ))" 0
expect "the second run validated no node (both passed with the driver and toolkit they run)" \
  "$(grep -c '"Validating 0 of 2 nodes"' "$work/second-run.log")" 1
expect "the workload on node 2 kept running, as the same pod" "$(workload)" "$workload_before"
# The driver's and the toolkit's source and own files are read once per node, in site.yml's preflight play; the
# batch reads every step of the chain again in one task per node (kubegpu.node.chain_plan: the roles' own plans, from
# what the preflight handed over) and, with nothing to do anywhere, includes no role.
expect "each node's driver planned once by its role (preflight)" "$(sed -n \
  '/^TASK \[kubegpu.node.nvidia_driver : Plan the driver from the node as it is/,/^TASK \[/p' \
  "$work/second-run.log" | grep -c '^ok: ')" 2
expect "each node's toolkit planned once by its role (preflight)" "$(sed -n \
  '/^TASK \[kubegpu.node.nvidia_container_toolkit : Plan the toolkit from the node as it is/,/^TASK \[/p' \
  "$work/second-run.log" | grep -c '^ok: ')" 2
expect "each node's chain read again in its batch, in one task" "$(sed -n \
  '/^TASK \[Read each step of the role chain again/,/^TASK \[/p' "$work/second-run.log" | grep -c '^ok: ')" 2
expect "no step of the chain run on either node" "$(sed -n \
  '/^TASK \[Run the steps of the role chain that have anything to do/,/^TASK \[/p' "$work/second-run.log" \
  | grep -c '^skipping: ')" 2
for n in "${nodes[@]}"; do
  expect "$n's containerd was not restarted again" "$(podman exec "$n" systemctl show -p MainPID --value containerd)" \
    "${containerd_pid[$n]}"
done
[ ${#failures[@]} -eq 0 ] || { echo "== The demo's checks failed: ${failures[*]}" >&2; exit 1; }
echo "== Second run: no changes"

echo "== Validating every node anyway (--tags validate -e kubegpu_validate=all): node 2's GPUs are all in use"
created_before=$(pods_created)
start=$(date +%s)
ansible-playbook -i demo/inventory.yml kubegpu.node.site --tags validate -e kubegpu_validate=all \
  -e "kubegpu_kubeconfig=$work/kubeconfig" ${DEMO_VERBOSE:+-vvv} >"$work/validate-run.log" \
  || { tail -n 60 "$work/validate-run.log"; exit 1; }
echo "== Validation of every node: $(( $(date +%s) - start )) s"
grep -E '^ *"(NODE|kubegpu-demo-node-[12]) ' "$work/validate-run.log" | sed 's/^ *"//; s/",\{0,1\}$//'
expect "node 2's row says it is skipped, all four GPUs in use" \
  "$(grep -Ec '"kubegpu-demo-node-2 .*skipped: 4/4 in use +skipped: 4/4 in use"' "$work/validate-run.log")" 1
expect "node 1 passed the pod and scheduling checks" \
  "$(grep -Ec '"kubegpu-demo-node-1 .*ok: GPU 0: .*ok: surplus pod Pending' "$work/validate-run.log")" 1
expect "validation pods were started on node 1 only (nvidia-smi, holder, surplus)" \
  "$(sim_call creations '["pods"]' | python -c 'import json, sys
new = json.load(sys.stdin)["result"][int(sys.argv[1]):]
print(" ".join(sorted({p["name"].split("-kubegpu-demo-")[1][:6] for p in new})), len(new))' "$created_before")" \
  "node-1 3"
expect "the workload on node 2 kept running, as the same pod" "$(workload)" "$workload_before"
expect "nothing was preempted" "$(sim_call preemptions | python -c 'import json, sys; print(json.load(sys.stdin)["result"])')" "[]"
[ ${#failures[@]} -eq 0 ] || { echo "== The demo's checks failed: ${failures[*]}" >&2; exit 1; }
echo "== A busy node is skipped, not failed; the workload is untouched"

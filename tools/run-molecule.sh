#!/usr/bin/env bash
# Runs each molecule scenario named (all of them by default) with the full test sequence and reports each one's time.
# MOLECULE_JOBS scenarios run at once (default 3): a scenario alone leaves the CPUs idle while it waits on downloads,
# reboots and the systemd of its containers, so three at a time shorten the run even on a two-core machine (in the CI
# run of 2026-11-29 at e3609b5 the ten took 103 minutes added up, the longest 23, and were done after about 35).
# Each scenario's output goes to .tmp/molecule/<scenario>.log; the end of a failed scenario's log is printed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
jobs=${MOLECULE_JOBS:-3}
logs="$root/.tmp/molecule"
mkdir -p "$logs"
# Not shared between scenarios: apt's archive of downloaded packages. A folder of the host mounted into every
# container was tried: apt does not wait for its lock (/var/cache/apt/archives/lock; DPkg::Lock::Timeout covers dpkg's
# lock only), so two scenarios installing at once failed with "Could not get lock".
scenarios=("$@")
if [ ${#scenarios[@]} -eq 0 ]; then
  for f in molecule/*/molecule.yml; do scenarios+=("$(basename "$(dirname "$f")")"); done
fi
# The longest scenarios start first, longest first, so that the others fill the slots beside them (longest processing
# time first: the order of their times in the last CI run, 2026-11-29 at e3609b5, three at a time beside the other
# gates on a 2-core machine: nvidia_driver_cuda 1391 s; nvidia_driver 1277 s, Debian's real driver built by DKMS
# through a compiler cache (399 s alone); docker_malformed 669 s; service_config_kill 663 s; kubelet 607 s;
# containerd 458 s; docker 364 s; nvidia_container_toolkit 332 s; crio 257 s; gpu_mig 149 s).
long_first=(nvidia_driver_cuda nvidia_driver docker_malformed service_config_kill kubelet containerd docker
  nvidia_container_toolkit crio gpu_mig)
ordered=()
for s in "${long_first[@]}"; do
  for t in "${scenarios[@]}"; do [ "$t" = "$s" ] && ordered+=("$s"); done
done
for t in "${scenarios[@]}"; do
  case " ${long_first[*]} " in *" $t "*) ;; *) ordered+=("$t") ;; esac
done
scenarios=("${ordered[@]}")

run_one() {
  local s=$1 start rc
  start=$(date +%s)
  molecule test --scenario-name "$s" >"$logs/$s.log" 2>&1
  rc=$?
  echo "$rc $(( $(date +%s) - start ))" >"$logs/$s.result"
}

# The key ansible logs in to every container with (.config/molecule/config.yml, tools/molecule-ssh-proxy.sh).
"$root/tools/molecule-ssh-proxy.sh" --make-key || exit 1

running=0
for s in "${scenarios[@]}"; do
  rm -f "$logs/$s.result"
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
  echo "molecule scenario $s: started (log: $logs/$s.log)"
  run_one "$s" &
  running=$((running + 1))
done
wait

failed=()
summary=()
for s in "${scenarios[@]}"; do
  read -r rc seconds <"$logs/$s.result" 2>/dev/null || { rc=1; seconds=0; }
  if [ "$rc" -eq 0 ]; then
    summary+=("molecule scenario $s: passed in ${seconds}s")
  else
    failed+=("$s")
    summary+=("molecule scenario $s: FAILED in ${seconds}s")
    echo "==== the last 150 lines of $s.log ===="
    tail -n 150 "$logs/$s.log"
  fi
done
printf '%s\n' "${summary[@]}"
echo "molecule: $(( ${#scenarios[@]} - ${#failed[@]} )) passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]

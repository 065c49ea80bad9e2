#!/usr/bin/env bash
# The gates of `make test`, arranged for a 2-core machine: the molecule scenarios in the background first (they are
# the longest gate, so they start before anything else: on the CI run of 2026-11-28 they ended the run alone), then
# the quick static gates and the other gates beside them. In the CI run of 2026-11-29 at e3609b5 the scenarios ended
# after about 2090 s (their log's last line; the time printed for molecule counts until the wait below returns) and
# lint, build, sanity, unit, awx and the demo took 2412 s one after the other, the demo alone at the end; the two
# cores were 94% busy over the run: it is bound by the CPU work of all gates together.
# Nothing they start shares a name: molecule's containers are named after their scenario, the demo's and the AWX
# test's after themselves.
# Every gate runs even when another failed; the exit status is non-zero when any failed; each gate's time is printed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
logs="$root/.tmp/gates"
mkdir -p "$logs"
declare -A result
order=()

gate() { # NAME COMMAND...: run in the foreground, output through (and into $logs/NAME.log, for the summary)
  local name=$1 start rc; shift
  order+=("$name")
  start=$(date +%s)
  "$@" 2>&1 | tee "$logs/$name.log"; rc=${PIPESTATUS[0]}
  result[$name]="$rc $(( $(date +%s) - start ))"
  echo "== $name: $(( $(date +%s) - start ))s (exit $rc)"
}

# Molecule in the background; its output goes to a log that is printed whole at the end (its own summary included).
order+=(molecule)
molecule_start=$(date +%s)
# How busy the machine's CPUs were over the whole run (from /proc/stat: idle and iowait against all), printed with the
# gates' times: near 100% says the run is bound by CPU (less work shortens it, more parallelism does not).
cpu_sample() { awk '/^cpu /{print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; exit}' /proc/stat; }
read -r idle_start total_start < <(cpu_sample)
make --no-print-directory molecule >"$logs/molecule.log" 2>&1 &
molecule_pid=$!
echo "== molecule: started in the background (log: $logs/molecule.log)"

gate lint make --no-print-directory lint
gate build make --no-print-directory build
gate sanity make --no-print-directory sanity

gate unit make --no-print-directory unit
gate awx make --no-print-directory awx
gate demo "$root/demo/run.sh"

wait "$molecule_pid"; rc=$?
result[molecule]="$rc $(( $(date +%s) - molecule_start ))"
echo "== molecule (its log follows)"
cat "$logs/molecule.log"
echo "== molecule: $(( $(date +%s) - molecule_start ))s (exit $rc)"

failed=()
echo "== gates"
read -r idle_end total_end < <(cpu_sample)
echo "CPU busy over the run: $(( 100 - 100 * (idle_end - idle_start) / (total_end - total_start + 1) ))% of $(grep -c "^cpu[0-9]" /proc/stat) CPUs (all of the machine's, as /proc/stat counts them)"
for name in "${order[@]}"; do
  read -r rc seconds <<<"${result[$name]}"
  printf '%-10s %5ss  %s\n' "$name" "$seconds" "$([ "$rc" -eq 0 ] && echo passed || echo "FAILED (exit $rc)")"
  [ "$rc" -eq 0 ] || failed+=("$name")
done
echo "gates: $(( ${#order[@]} - ${#failed[@]} )) passed, ${#failed[@]} failed"
# What failed, last: CI keeps the end of the output, and the molecule log printed above is long. Each failed
# scenario's failed tasks (Ansible's "fatal:"/"failed:" lines and the task name before them) and molecule's own
# complaints (CRITICAL, the tasks an idempotence check found changed), each line cut at 800 bytes.
sed -n 's/^molecule scenario \([^:]*\): FAILED.*/\1/p' "$logs/molecule.log" 2>/dev/null | while read -r s; do
  echo "== why molecule scenario $s failed ($root/.tmp/molecule/$s.log)"
  grep -E '^(TASK \[|fatal: |failed: |CRITICAL|\* \[)' "$root/.tmp/molecule/$s.log" |
    grep -E -B1 '^(fatal: |failed: |CRITICAL|\* \[)' | grep -v '^--$' |
    cut -c1-800 | tail -n 24
done
# A failed foreground gate's last lines (its reason is otherwise far up in the output).
for name in "${failed[@]}"; do
  if [ "$name" = molecule ] || [ ! -f "$logs/$name.log" ]; then continue; fi
  echo "== why $name failed (the end of $logs/$name.log)"
  tail -n 30 "$logs/$name.log" | cut -c1-800
done
[ ${#failed[@]} -eq 0 ] || { echo "== failed: ${failed[*]}"; exit 1; }

#!/usr/bin/env bash
# Runs each molecule scenario named (all of them by default) with the full test sequence and reports each one's time.
# Scenarios run one after another: each already runs its platforms in parallel, and the machines have two cores.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
scenarios=("$@")
if [ ${#scenarios[@]} -eq 0 ]; then
  for f in molecule/*/molecule.yml; do scenarios+=("$(basename "$(dirname "$f")")"); done
fi
failed=()
summary=()
for s in "${scenarios[@]}"; do
  start=$(date +%s)
  if molecule test --scenario-name "$s"; then result=passed; else result=FAILED; failed+=("$s"); fi
  summary+=("molecule scenario $s: $result in $(( $(date +%s) - start ))s")
done
printf '%s\n' "${summary[@]}"
echo "molecule: $(( ${#scenarios[@]} - ${#failed[@]} )) passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]

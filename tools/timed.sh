#!/usr/bin/env bash
# Runs a command and reports how long it took: `timed.sh NAME COMMAND...`.
set -uo pipefail
name=$1; shift
start=$(date +%s)
"$@"; rc=$?
echo "== $name: $(( $(date +%s) - start ))s (exit $rc)"
exit $rc

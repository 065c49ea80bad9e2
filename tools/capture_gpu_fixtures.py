"""Capture what a real NVIDIA GPU node answers to the collection's own node reads, for test fixtures.

    python tools/capture_gpu_fixtures.py emit DIR     # here: writes DIR/run.sh and the read scripts, verbatim from
                                                      # plugins/ (the same text the actions send to a node)
    sh DIR/run.sh OUTDIR                              # on a GPU machine, as root: runs them idle, then again while a
                                                      # CUDA process holds the GPU; leaves OUTDIR/capture.tar.gz

Read-only: nothing here changes the GPU's settings (no MIG, clocks, persistence mode or reset). The busy phase starts
one CUDA process (python3 with torch, or else nothing) that allocates 1 GiB and sleeps, and stops it at the end.
Where the fixtures it made live and what each stands for: tests/unit/plugins/plugin_utils/fixtures/real/README.md.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = r"""#!/bin/sh
# Written by tools/capture_gpu_fixtures.py; run as root on a GPU machine: sh run.sh OUTDIR
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?OUTDIR}
cap=$(mktemp -d)
cd "$cap" || exit 1
save() { name=$1; shift; "$@" >"$name.out" 2>"$name.err"; echo "$?" >"$name.rc"; }
phase() {
  p=$1
  save "$p-smi-q-x" nvidia-smi -q -x
  save "$p-smi-query-apps" nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name --format=csv,noheader
  save "$p-driver-read" sh "$here/driver.sh"
  save "$p-health-read" sh "$here/health.sh" nvidia-smi "" /sys/bus/pci/devices 20
  save "$p-mig-read" sh "$here/mig.sh" nvidia-smi
  save "$p-gpu-probe" sh "$here/gpu_probe.sh"
  save "$p-toolkit-links" sh "$here/links.sh"
}
save version nvidia-smi --version
save smi nvidia-smi
save smi-L nvidia-smi -L
save smi-q nvidia-smi -q
save smi-q-x-dtd nvidia-smi -q -x --dtd
fields=index,name,uuid,memory.total,pci.bus_id,compute_cap
save query-driver-units nvidia-smi --query-gpu=$fields --format=csv
save query-driver nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits
save query-validation nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader
save mig-lgip nvidia-smi mig -lgip
save mig-lgipp nvidia-smi mig -lgipp
save mig-lcip nvidia-smi mig -lcip
save mig-lgi nvidia-smi mig -lgi
save mig-lci nvidia-smi mig -lci
save topo nvidia-smi topo -m
save nvlink nvidia-smi nvlink -s
save proc-version cat /proc/driver/nvidia/version
save sys-version cat /sys/module/nvidia/version
save modinfo modinfo nvidia
save devices sh -c 'ls -l /dev/nvidia* /dev/nvidia-caps /dev/char 2>&1 | head -200'
save pci sh -c 'for d in /sys/bus/pci/devices/*; do
  printf "%s %s %s %s\n" "${d##*/}" "$(cat $d/vendor)" "$(cat $d/device)" "$(cat $d/class)"; done'
save kernel-nvrm sh -c 'dmesg 2>&1 | grep -E "NVRM|nvidia" | tail -50'
save os sh -c 'uname -a; cat /etc/os-release
  command -v dpkg-query && dpkg-query -W -f="\${Package} \${Version}\n" "*nvidia*" "*cuda-drivers*" 2>/dev/null'
phase idle
py=$(command -v python3)
"$py" -c 'import torch, time, sys
x = torch.empty(1 << 28, dtype=torch.float32, device="cuda"); torch.cuda.synchronize()
print("holding", x.numel() * 4, flush=True); sys.stdout.close(); time.sleep(300)' >"$cap/busy-holder.out" 2>&1 &
holder=$!
i=0
while [ $i -lt 60 ] && kill -0 "$holder" 2>/dev/null && ! grep -q holding "$cap/busy-holder.out" 2>/dev/null; do
  sleep 1; i=$((i+1))
done
echo "$holder" >busy-holder.pid
phase busy
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
mkdir -p "$out"
tar -czf "$out/capture.tar.gz" -C "$cap" .
ls -l "$cap" >"$out/listing.txt"
"""


def emit(target: Path) -> None:
    sys.path.insert(0, str(ROOT / ".tmp" / "collections"))
    from ansible_collections.kubegpu.node.plugins.plugin_utils import (
        _gpu_health,
        _nvidia_container_toolkit,
        _nvidia_driver,
        _service_config,
    )

    mig_source = (ROOT / "plugins" / "action" / "gpu_mig.py").read_text()
    # The action imports Ansible; take its READ_SCRIPT literal without importing it.
    start = mig_source.index('READ_SCRIPT = r"""') + len('READ_SCRIPT = r"""')
    mig_script = mig_source[start : mig_source.index('"""', start)]

    target.mkdir(parents=True, exist_ok=True)
    argv = _nvidia_driver.read_argv([], ["nvidia-*", "libnvidia-*", "cuda-drivers*"], full=False)
    # The whole command the action runs (its environment's values hold spaces: the package patterns, the files).
    (target / "driver.sh").write_text(shlex.join(argv) + "\n")
    (target / "health.sh").write_text(_gpu_health.READ_SCRIPT)
    (target / "mig.sh").write_text(mig_script)
    (target / "gpu_probe.sh").write_text(_service_config.GPU_PROBE_SCRIPT)
    (target / "links.sh").write_text(_nvidia_container_toolkit.LINKS_SCRIPT + "exit 0\n")
    (target / "run.sh").write_text(RUN)
    os.chmod(target / "run.sh", 0o755)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "emit":
        sys.exit(__doc__)
    emit(Path(sys.argv[2]))

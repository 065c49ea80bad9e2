# Test tooling for molecule/kubelet: writes the command line it was started with (argv[0] included, as the kernel
# has it) to /run/kubegpu-probe.json.
import json

with open("/proc/self/cmdline", "rb") as handle:
    argv = [part.decode() for part in handle.read().split(b"\0")[:-1]]
with open("/run/kubegpu-probe.json", "w", encoding="utf-8") as handle:
    json.dump({"argv": argv}, handle)

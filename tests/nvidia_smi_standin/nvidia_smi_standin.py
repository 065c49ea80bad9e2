# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A STAND-IN for NVIDIA's nvidia-smi and a MIG-capable GPU, for tests only (no GPU can be had on the test machines).

It keeps the GPUs' MIG state in a JSON file (NVIDIA_SMI_STANDIN_STATE, default /var/lib/nvidia-smi-standin/state.json)
and answers the commands the kubegpu.node.gpu_mig role uses, in the output formats NVIDIA's MIG User Guide shows
("Getting Started with MIG": -mig, mig -lgip, -lgipp, -cgi -C, -lgi, -cci/-lci, -dci, -dgi, --gpu-reset), and where a
real driver 580.159.04 was captured printing them otherwise, as it prints them (the real H200's output in
tests/unit/plugins/plugin_utils/fixtures/real/h200_580: the 81-column `mig -lgip` table; `mig -lgip`/`-lgipp` listing
the profiles while MIG is disabled; `mig -lgi`/`-lci` saying "No MIG-enabled devices found." with exit 0):

  --query-gpu=FIELDS --format=csv[,noheader][,nounits]   index, uuid, name, pci.bus_id, pci.device_id, memory.total,
                                                          mig.mode.current, mig.mode.pending, compute_cap
  --query-compute-apps=gpu_uuid,pid,process_name --format=csv[,noheader]
  -L
  -i N -mig 0|1           the driver resets the GPU to make the mode current ("Enabled MIG Mode for GPU ...");
                          where it cannot (a process holds the GPU, or the GPU's "reset" is "refused", as in a
                          passthrough VM) the mode stays pending, with the guide's warning
  -i N --gpu-reset        makes a pending mode current and clears the instances (refused while processes run)
  mig [-i N] -lgip | -lgipp        every MIG-capable GPU's profiles, whatever its MIG mode
  mig [-i N] -lgi | -lci [-gi ID]  the GPU instances / compute instances of the GPUs with MIG enabled
  mig [-i N] -cgi P[,P...] [-C]   P: a profile ID, a short name (3g.20gb) or a full name (MIG 3g.20gb); placed as
                                  the guide's examples show the driver placing them (choose_placement);
                                  "Insufficient Resources" when no placement is free
  mig [-i N] -cci [P[,P...]] -gi ID    (P: compute instance profile ID; default: the full one)
  mig [-i N] -dci [-ci IDS] [-gi IDS]  /  -dgi [-gi IDS]   refused ("In use by another client") while processes run;
                                  a GPU instance with compute instances is refused too

Test controls, not nvidia-smi's: --standin-reboot (a pending mode becomes current, MIG instances are gone, as after
a reboot), --standin-process N PID NAME (a compute process on GPU N), --standin-no-processes.
With "driver_loaded": false in the state, every command fails as nvidia-smi does without a driver (exit 9).

The GPU models it knows are its OWN table (kept apart from the role's on purpose: this one models the GPU, the role's
decides): profile IDs, instance counts, memory, SMs and engines of the A100-SXM4-40GB as the guide prints them
(`nvidia-smi mig -lgip` and `-lgipp`), the A100-SXM4-80GB's names from the guide's note and its figures as published
`nvidia-smi mig -lgip` output shows them, an H200 with the figures a real H200 printed (driver 580.159.04: name,
device ID, memory, compute capability, `mig -lgip` and `-lgipp`), and a Tesla T4 (no MIG). Runs on Python 3.8 and
later.
"""

import json
import os
import sys

STATE_FILE = os.environ.get("NVIDIA_SMI_STANDIN_STATE", "/var/lib/nvidia-smi-standin/state.json")

# Return codes (nvidia-smi(1), RETURN VALUE): 2 invalid argument, 3 not available on the target, 6 not found,
# 9 driver not loaded; 1 stands for the others here (Insufficient Resources, In use by another client).
NOT_AVAILABLE, NOT_FOUND, NO_DRIVER = 3, 6, 9

# Compute instance profile IDs by SM slices (NVML_COMPUTE_INSTANCE_PROFILE_1/2/3/4/7_SLICE).
CI_PROFILE_IDS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}

# profile ID: (name, instances, memory GiB, SMs, DEC, ENC, CE, JPEG, OFA, placement starts, size in memory slices)
A100_40 = {
    19: ("1g.5gb", 7, "4.75", 14, 0, 0, 1, 0, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    20: ("1g.5gb+me", 1, "4.75", 14, 1, 0, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    15: ("1g.10gb", 4, "9.62", 14, 1, 0, 1, 0, 0, (0, 2, 4, 6), 2),
    14: ("2g.10gb", 3, "9.62", 28, 1, 0, 2, 0, 0, (0, 2, 4), 2),
    9: ("3g.20gb", 2, "19.62", 42, 2, 0, 3, 0, 0, (0, 4), 4),
    5: ("4g.20gb", 1, "19.62", 56, 2, 0, 4, 0, 0, (0,), 4),
    0: ("7g.40gb", 1, "39.50", 98, 5, 0, 7, 1, 1, (0,), 8),
}
A100_80 = {
    19: ("1g.10gb", 7, "9.50", 14, 0, 0, 1, 0, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    20: ("1g.10gb+me", 1, "9.50", 14, 1, 0, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    15: ("1g.20gb", 4, "19.50", 14, 1, 0, 1, 0, 0, (0, 2, 4, 6), 2),
    14: ("2g.20gb", 3, "19.50", 28, 1, 0, 2, 0, 0, (0, 2, 4), 2),
    9: ("3g.40gb", 2, "39.25", 42, 2, 0, 3, 0, 0, (0, 4), 4),
    5: ("4g.40gb", 1, "39.25", 56, 2, 0, 4, 0, 0, (0,), 4),
    0: ("7g.80gb", 1, "79.00", 98, 5, 0, 7, 1, 1, (0,), 8),
}
# A real H200's `nvidia-smi mig -lgip` and `-lgipp` (driver 580.159.04, tests/unit/plugins/plugin_utils/fixtures/real).
H200 = {
    19: ("1g.18gb", 7, "16.00", 16, 1, 0, 1, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    20: ("1g.18gb+me", 1, "16.00", 16, 1, 0, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    15: ("1g.35gb", 4, "32.50", 26, 1, 0, 1, 1, 0, (0, 2, 4, 6), 2),
    14: ("2g.35gb", 3, "32.50", 32, 2, 0, 2, 2, 0, (0, 2, 4), 2),
    9: ("3g.71gb", 2, "69.75", 60, 3, 0, 3, 3, 0, (0, 4), 4),
    5: ("4g.71gb", 1, "69.75", 64, 4, 0, 4, 4, 0, (0,), 4),
    0: ("7g.141gb", 1, "140.00", 132, 7, 0, 8, 7, 1, (0,), 8),
}
MODELS = {
    "A100-SXM4-40GB": {
        "name": "NVIDIA A100-SXM4-40GB",
        "device_id": "0x20B010DE",
        "memory": 40960,
        "cc": "8.0",
        "profiles": A100_40,
    },
    "A100-SXM4-80GB": {
        "name": "NVIDIA A100-SXM4-80GB",
        "device_id": "0x20B210DE",
        "memory": 81920,
        "cc": "8.0",
        "profiles": A100_80,
    },
    "H200": {"name": "NVIDIA H200", "device_id": "0x233510DE", "memory": 143771, "cc": "9.0", "profiles": H200},
    "T4": {"name": "Tesla T4", "device_id": "0x1EB810DE", "memory": 15360, "cc": "7.5", "profiles": None},
}


class Failure(Exception):
    def __init__(self, text, code=1):
        super().__init__(text)
        self.code = code


def load():
    with open(STATE_FILE) as handle:
        return json.load(handle)


def save(state):
    tmp = STATE_FILE + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(state, handle, indent=2, sort_keys=True)
    os.replace(tmp, STATE_FILE)


def model(gpu):
    return MODELS[gpu["model"]]


def profiles(gpu):
    return model(gpu)["profiles"]


def mode_text(gpu, key):
    if profiles(gpu) is None:
        return "[N/A]"
    return "Enabled" if (gpu.get("mig") or {}).get(key) else "Disabled"


def bus_id(gpu):
    return gpu.get("pci_bus_id") or "00000000:%02X:00.0" % (7 + 8 * gpu["index"])


def select(state, index):
    gpus = state["gpus"]
    if index is None:
        return gpus
    found = [g for g in gpus if str(g["index"]) == str(index) or g["uuid"] == index or bus_id(g) == index]
    if not found:
        raise Failure("No devices were found", NOT_FOUND)
    return found


NO_MIG = "No MIG-enabled devices found."


def mig_gpus(gpus):
    enabled = [g for g in gpus if profiles(g) is not None and g["mig"]["current"]]
    if not enabled:
        raise Failure(NO_MIG, NOT_FOUND)
    return enabled


def listed_gpus(gpus, capable=False):
    """The GPUs a listing covers: MIG-capable ones (-lgip, -lgipp: driver 580 lists their profiles with MIG disabled)
    or those with MIG enabled (-lgi, -lci). None when there is none: the real driver then says NO_MIG, exit 0."""
    found = [g for g in gpus if profiles(g) is not None and (capable or g["mig"]["current"])]
    return found or None


# ---- queries -------------------------------------------------------------------------------------------------------

QUERY = {
    "index": lambda g: str(g["index"]),
    "uuid": lambda g: g["uuid"],
    "name": lambda g: model(g)["name"],
    "pci.bus_id": bus_id,
    "pci.device_id": lambda g: model(g)["device_id"],
    "memory.total": lambda g: "%d MiB" % model(g)["memory"],
    "mig.mode.current": lambda g: mode_text(g, "current"),
    "mig.mode.pending": lambda g: mode_text(g, "pending"),
    "compute_cap": lambda g: model(g)["cc"],
}


def csv_options(args):
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "")
    options = fmt.split(",")
    if "csv" not in options:
        raise Failure("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 2)
    return "noheader" in options, "nounits" in options


def query_gpu(state, args, index):
    fields = next(a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")).split(",")
    for name in fields:
        if name not in QUERY:
            raise Failure('Field "%s" is not a valid field to query.' % name, 2)
    noheader, nounits = csv_options(args)
    lines = []
    if not noheader:
        lines.append(", ".join(f + (" [MiB]" if f == "memory.total" else "") for f in fields))
    for gpu in select(state, index):
        values = [QUERY[f](gpu) for f in fields]
        if nounits:
            values = [v[:-4] if v.endswith(" MiB") else v for v in values]
        lines.append(", ".join(values))
    return "\n".join(lines)


def query_apps(state, args):
    fields = next(a.split("=", 1)[1] for a in args if a.startswith("--query-compute-apps=")).split(",")
    noheader, _nounits = csv_options(args)
    lines = [] if noheader else [", ".join(fields)]
    for gpu in state["gpus"]:
        for process in gpu.get("processes") or []:
            row = {"gpu_uuid": gpu["uuid"], "pid": str(process["pid"]), "process_name": process["name"]}
            lines.append(", ".join(row.get(f, "[N/A]") for f in fields))
    return "\n".join(lines)


def list_gpus(state):
    lines = []
    for gpu in state["gpus"]:
        lines.append("GPU %d: %s (UUID: %s)" % (gpu["index"], model(gpu)["name"], gpu["uuid"]))
        for device, gi in enumerate(sorted(gpu.get("gis") or [], key=lambda g: g["id"])):
            for ci in gi["cis"]:
                name = profiles(gpu)[gi["profile_id"]][0]
                lines.append(
                    "  MIG %-12s Device %2d: (UUID: MIG-%s-%04d-%04d)"
                    % (name, device, gpu["uuid"][4:12], gi["id"], ci["id"])
                )
    return "\n".join(lines)


# ---- MIG mode and reset ------------------------------------------------------------------------------------------


def set_mode(state, index, value):
    enable = value == "1"
    word = "enable" if enable else "disable"
    lines = []
    for gpu in select(state, index):
        if profiles(gpu) is None:
            raise Failure("Unable to %s MIG Mode for GPU %s: Not Supported" % (word, bus_id(gpu)), NOT_AVAILABLE)
        if not enable and gpu.get("gis"):
            raise Failure("Unable to disable MIG Mode for GPU %s: In use by another client" % bus_id(gpu))
        gpu["mig"]["pending"] = enable
        if gpu["mig"]["current"] == enable:
            lines.append("%s MIG Mode for GPU %s" % ("Enabled" if enable else "Disabled", bus_id(gpu)))
        elif gpu.get("processes"):
            lines += [
                "Warning: MIG mode is in pending %s state for GPU %s:In use by another client" % (word, bus_id(gpu)),
                "%s is currently being used by one or more other processes (e.g. CUDA application or a monitoring "
                "application such as another instance of nvidia-smi). Please first kill all processes using the device "
                "and retry the command or reboot the system to make MIG mode effective." % bus_id(gpu),
            ]
        elif gpu.get("reset") == "refused":
            lines += [
                "Warning: MIG mode is in pending %s state for GPU %s:Not Supported" % (word, bus_id(gpu)),
                "Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective on GPU %s" % bus_id(gpu),
            ]
        else:
            gpu["mig"]["current"] = enable
            lines.append("%s MIG Mode for GPU %s" % ("Enabled" if enable else "Disabled", bus_id(gpu)))
    save(state)
    return "\n".join([*lines, "All done."])


def reset(state, index):
    lines = []
    for gpu in select(state, index):
        if gpu.get("reset") == "refused":
            raise Failure("Resetting GPU %s is not supported." % bus_id(gpu), NOT_AVAILABLE)
        if gpu.get("processes"):
            raise Failure("GPU %s is currently in use by another process." % bus_id(gpu))
        gpu["mig"]["current"] = gpu["mig"]["pending"]
        gpu["gis"] = []
        lines.append("GPU %s was successfully reset." % bus_id(gpu))
    save(state)
    return "\n".join([*lines, "All done."])


def reboot(state):
    for gpu in state["gpus"]:
        if profiles(gpu) is not None:
            gpu["mig"]["current"] = gpu["mig"]["pending"]
            gpu["gis"] = []
        gpu["processes"] = []
    save(state)
    return ""


# ---- MIG instances ---------------------------------------------------------------------------------------------------


def used_slices(gpu):
    used = set()
    for gi in gpu.get("gis") or []:
        used |= set(range(gi["start"], gi["start"] + gi["size"]))
    return used


def free_placements(gpu, pid):
    spec = profiles(gpu)[pid]
    used = used_slices(gpu)
    return [s for s in spec[9] if not used & set(range(s, s + spec[10]))]


def free_block(used, start, size, slices):
    """The largest aligned block of free memory slices (1, 2, 4, 8) around a placement."""
    best, block = 0, 1
    while block <= slices:
        first = start // block * block
        if first + block >= start + size and not used & set(range(first, first + block)):
            best = block
        block *= 2
    return best


def choose_placement(gpu, pid):
    """Where the driver puts a new GPU instance: in the smallest free block that takes it, the lowest placement
    there; on an empty GPU the upper one. This reproduces the placements of the MIG User Guide's examples (-cgi
    9,3g.20gb: 4:4 then 0:4; -cgi 9,19,14,19: 4:4, 0:1, 2:2, 1:1; -cgi 14,19,19,19,19,19: 4:2, 6:1, 0:1 to 3:1)."""
    if gpu.get("placement") == "first-fit":
        # A test knob: a driver that takes the first free placement, which can leave no room for a later instance.
        free = free_placements(gpu, pid)
        return free[0] if free else None
    size, slices = profiles(gpu)[pid][10], 8
    used = used_slices(gpu)
    ranked = []
    for start in free_placements(gpu, pid):
        block = free_block(used, start, size, slices)
        ranked.append((block, -start if block == slices else start, start))
    return min(ranked)[2] if ranked else None


def free_count(gpu, pid):
    """How many more instances of the profile fit (first fit), within its instance count."""
    spec = profiles(gpu)[pid]
    used = used_slices(gpu)
    count = sum(1 for gi in gpu.get("gis") or [] if gi["profile_id"] == pid)
    free = 0
    for start in spec[9]:
        cells = set(range(start, start + spec[10]))
        if not used & cells and count + free < spec[1]:
            used |= cells
            free += 1
    return free


def border(width):
    return "+" + "-" * (width - 2) + "+"


def lgip(state, index):
    """Driver 580's table (81 columns; the guide's older drivers printed 79, with a narrower Name column)."""
    gpus = listed_gpus(select(state, index), capable=True)
    if gpus is None:
        return NO_MIG
    lines = [
        border(81),
        "| GPU instance profiles:" + " " * 56 + "|",
        "| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |",
        "|                                Free/Total   GiB              CE    JPEG  OFA  |",
        "|" + "=" * 79 + "|",
    ]
    for gpu in gpus:
        for pid in sorted(profiles(gpu), key=lambda p: (profiles(gpu)[p][10], profiles(gpu)[p][3], p)):
            name, total, memory, sm, dec, enc, ce, jpeg, ofa = profiles(gpu)[pid][:9]
            ratio = "%d/%d" % (free_count(gpu, pid), total)
            lines.append(
                "|%4d  %-18s%4d     %-11s%-11sNo     %-3d%5d%6d   |"
                % (gpu["index"], "MIG " + name, pid, ratio, memory, sm, dec, enc)
            )
            lines.append("|" + " " * 61 + "%3d%6d%6d   |" % (ce, jpeg, ofa))
            lines.append(border(81))
    return "\n".join(lines)


def lgipp(state, index):
    gpus = listed_gpus(select(state, index), capable=True)
    if gpus is None:
        return NO_MIG
    lines = []
    for gpu in gpus:
        for pid in sorted(profiles(gpu), key=lambda p: (profiles(gpu)[p][10], profiles(gpu)[p][3], p)):
            starts, size = profiles(gpu)[pid][9], profiles(gpu)[pid][10]
            word = "Placements:" if len(starts) > 1 else "Placement :"
            lines.append(
                "GPU %2d Profile ID %2d %s {%s}:%d" % (gpu["index"], pid, word, ",".join(map(str, starts)), size)
            )
    return "\n".join(lines)


def listing(title, headings, rows, missing):
    """nvidia-smi's boxed listing: a title, column headings, then each row under a rule."""
    if not rows:
        raise Failure(missing, NOT_FOUND)
    width = len(headings[0])
    lines = [border(width), "| %s" % title.ljust(width - 3) + "|", *headings, "|" + "=" * (width - 2) + "|"]
    for row in rows:
        lines += [row, border(width)]
    return "\n".join(lines)


def lgi(state, index):
    gpus = listed_gpus(select(state, index))
    if gpus is None:
        return NO_MIG
    rows = []
    for gpu in gpus:
        for gi in sorted(gpu.get("gis") or [], key=lambda g: g["start"]):
            name = "MIG " + profiles(gpu)[gi["profile_id"]][0]
            placement = "%d:%d" % (gi["start"], gi["size"])
            rows.append("|%4d  %-13s%6d%9d%13s     |" % (gpu["index"], name, gi["profile_id"], gi["id"], placement))
    headings = [
        "| GPU   Name          Profile  Instance   Placement  |",
        "|                       ID       ID       Start:Size |",
    ]
    return listing("GPU instances:", headings, rows, "No GPU instances found: Not Found")


def compute_slices(gpu, gi):
    return int(profiles(gpu)[gi["profile_id"]][0].split("g.", 1)[0])


def ci_name(gpu, gi, ci):
    name = profiles(gpu)[gi["profile_id"]][0]
    slices = {v: k for k, v in CI_PROFILE_IDS.items()}[ci["profile_id"]]
    return "MIG " + (name if slices == compute_slices(gpu, gi) else "%dc.%s" % (slices, name))


def lci(state, index, gi_ids):
    gpus = listed_gpus(select(state, index))
    if gpus is None:
        return NO_MIG
    rows = []
    for gpu in gpus:
        for gi in sorted(gpu.get("gis") or [], key=lambda g: g["id"]):
            for ci in gi["cis"] if not gi_ids or gi["id"] in gi_ids else []:
                name = ci_name(gpu, gi, ci)
                rows.append(
                    "|%4d%7d       %-16s%6d%10d     |" % (gpu["index"], gi["id"], name, ci["profile_id"], ci["id"])
                )
    headings = [
        "| GPU     GPU       Name             Profile   Instance |",
        "|       Instance                       ID        ID     |",
        "|         ID                                            |",
    ]
    return listing("Compute instances:", headings, rows, "No compute instances found: Not Found")


def profile_id(gpu, text):
    text = text.strip()
    if text.isdigit() and int(text) in profiles(gpu):
        return int(text)
    short = text[4:] if text.startswith("MIG ") else text
    for pid, spec in profiles(gpu).items():
        if spec[0] == short:
            return pid
    raise Failure("Invalid GPU instance profile: %s" % text, 2)


def create_ci(gpu, gi, ci_profile, lines):
    ci_id = min(set(range(8)) - {c["id"] for c in gi["cis"]})
    gi["cis"].append({"id": ci_id, "profile_id": ci_profile})
    lines.append(
        "Successfully created compute instance ID %2d on GPU %2d GPU instance ID %2d using profile %s (ID %2d)"
        % (ci_id, gpu["index"], gi["id"], ci_name(gpu, gi, gi["cis"][-1]), ci_profile)
    )


def cgi(state, index, spec, default_ci):
    lines = []
    for gpu in mig_gpus(select(state, index)):
        for text in spec.split(","):
            pid = profile_id(gpu, text)
            start = choose_placement(gpu, pid)
            same = sum(1 for gi in gpu.get("gis") or [] if gi["profile_id"] == pid)
            if start is None or same >= profiles(gpu)[pid][1]:
                save(state)
                print("\n".join(lines))
                raise Failure(
                    "Unable to create a GPU instance on GPU %2d using profile %d: Insufficient Resources\n"
                    "Failed to create GPU instances: Insufficient Resources" % (gpu["index"], pid)
                )
            gi_id = min(set(range(1, 15)) - {g["id"] for g in gpu.get("gis") or []})
            gi = {"id": gi_id, "profile_id": pid, "start": start, "size": profiles(gpu)[pid][10], "cis": []}
            gpu.setdefault("gis", []).append(gi)
            lines.append(
                "Successfully created GPU instance ID %2d on GPU %2d using profile MIG %s (ID %2d)"
                % (gi_id, gpu["index"], profiles(gpu)[pid][0], pid)
            )
            if default_ci:
                create_ci(gpu, gi, CI_PROFILE_IDS[compute_slices(gpu, gi)], lines)
    save(state)
    return "\n".join(lines)


def cci(state, index, spec, gi_ids):
    lines = []
    for gpu in mig_gpus(select(state, index)):
        for gi in gpu.get("gis") or []:
            if gi_ids and gi["id"] not in gi_ids:
                continue
            wanted = [int(p) for p in spec.split(",")] if spec else [CI_PROFILE_IDS[compute_slices(gpu, gi)]]
            for ci_profile in wanted:
                create_ci(gpu, gi, ci_profile, lines)
    save(state)
    return "\n".join(lines)


def dci(state, index, ci_ids, gi_ids):
    lines = []
    for gpu in mig_gpus(select(state, index)):
        for gi in sorted(gpu.get("gis") or [], key=lambda g: g["id"]):
            if gi_ids and gi["id"] not in gi_ids:
                continue
            for ci in list(gi["cis"]):
                if ci_ids and ci["id"] not in ci_ids:
                    continue
                if gpu.get("processes"):
                    raise Failure(
                        "Unable to destroy compute instance ID %2d from GPU %2d GPU instance ID %2d: In use by another "
                        "client\nFailed to destroy compute instances: In use by another client"
                        % (ci["id"], gpu["index"], gi["id"])
                    )
                gi["cis"].remove(ci)
                lines.append(
                    "Successfully destroyed compute instance ID %2d from GPU %2d GPU instance ID %2d"
                    % (ci["id"], gpu["index"], gi["id"])
                )
    if not lines:
        raise Failure("No compute instances found: Not Found", NOT_FOUND)
    save(state)
    return "\n".join(lines)


def dgi(state, index, gi_ids):
    lines = []
    for gpu in mig_gpus(select(state, index)):
        for gi in sorted(gpu.get("gis") or [], key=lambda g: g["id"]):
            if gi_ids and gi["id"] not in gi_ids:
                continue
            if gi["cis"] or gpu.get("processes"):
                raise Failure(
                    "Unable to destroy GPU instance ID %2d from GPU %2d: In use by another client\n"
                    "Failed to destroy GPU instances: In use by another client" % (gi["id"], gpu["index"])
                )
            gpu["gis"].remove(gi)
            lines.append("Successfully destroyed GPU instance ID %2d from GPU %2d" % (gi["id"], gpu["index"]))
    if not lines:
        raise Failure("No GPU instances found: Not Found", NOT_FOUND)
    save(state)
    return "\n".join(lines)


# ---- the command line ------------------------------------------------------------------------------------------------


def option(args, *names):
    for name in names:
        if name in args:
            position = args.index(name)
            if position + 1 >= len(args):
                raise Failure("Option %s needs a value." % name, 2)
            return args[position + 1]
    return None


def ids(text):
    return {int(i) for i in text.split(",")} if text else set()


def main(argv):
    args = list(argv)
    if args[:1] == ["--standin-reboot"]:
        return reboot(load())
    state = load()
    if args[:1] == ["--standin-process"]:
        gpu = select(state, args[1])[0]
        gpu.setdefault("processes", []).append({"pid": int(args[2]), "name": args[3]})
        save(state)
        return ""
    if args[:1] == ["--standin-no-processes"]:
        for gpu in state["gpus"]:
            gpu["processes"] = []
        save(state)
        return ""
    if not state.get("driver_loaded", True):
        raise Failure(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
            "NVIDIA driver is installed and running.",
            NO_DRIVER,
        )
    index = option(args, "-i", "--id")
    if any(a.startswith("--query-gpu=") for a in args):
        return query_gpu(state, args, index)
    if any(a.startswith("--query-compute-apps=") for a in args):
        return query_apps(state, args)
    if args == ["-L"]:
        return list_gpus(state)
    if "-mig" in args or "--multi-instance-gpu" in args:
        return set_mode(state, index, option(args, "-mig", "--multi-instance-gpu"))
    if "-r" in args or "--gpu-reset" in args:
        return reset(state, index)
    if args[:1] == ["mig"]:
        gi_ids = ids(option(args, "-gi", "--gpu-instance-id"))
        if "-lgip" in args or "--list-gpu-instance-profiles" in args:
            return lgip(state, index)
        if "-lgipp" in args or "--list-gpu-instance-possible-placements" in args:
            return lgipp(state, index)
        if "-lgi" in args or "--list-gpu-instances" in args:
            return lgi(state, index)
        if "-lci" in args or "--list-compute-instances" in args:
            return lci(state, index, gi_ids)
        if "-cgi" in args or "--create-gpu-instance" in args:
            return cgi(state, index, option(args, "-cgi", "--create-gpu-instance"), "-C" in args)
        if "-cci" in args or "--create-compute-instance" in args:
            position = args.index("-cci") if "-cci" in args else args.index("--create-compute-instance")
            follows = args[position + 1] if position + 1 < len(args) else ""
            return cci(state, index, "" if follows.startswith("-") else follows, gi_ids)
        if "-dci" in args or "--destroy-compute-instance" in args:
            return dci(state, index, ids(option(args, "-ci", "--compute-instance-id")), gi_ids)
        if "-dgi" in args or "--destroy-gpu-instance" in args:
            return dgi(state, index, gi_ids)
    raise Failure("nvidia-smi stand-in: %s is not implemented (see tests/nvidia_smi_standin)" % " ".join(args), 2)


def run(argv):
    try:
        text = main(argv)
    except Failure as failure:
        print(str(failure))
        return failure.code
    if text:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))

"""The collection's parsers on what a real NVIDIA H200 node answered (driver 580.159.04, Ubuntu 24.04.3).

Every input is a byte-exact capture (fixtures/real/h200_580/, see its README): the collection's own read scripts run
on the GPU machine idle, then while a CUDA process (python3 with torch, pid 606) held the GPU. The assertions are what a
user would notice: the verdict, the GPU count, the driver version, MIG off and its profiles, a change held back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _gpu_health as gh
from ansible_collections.kubegpu.node.plugins.plugin_utils import _gpu_validation as gv
from ansible_collections.kubegpu.node.plugins.plugin_utils import _mig as mig
from ansible_collections.kubegpu.node.plugins.plugin_utils import _nvidia_container_toolkit as nct
from ansible_collections.kubegpu.node.plugins.plugin_utils import _nvidia_driver as nd
from ansible_collections.kubegpu.node.plugins.plugin_utils import _service_config as sc

REAL = Path(__file__).parent / "fixtures" / "real" / "h200_580"
UUID = "GPU-a5b8dffa-01a7-5ab4-0101-dde5c25f8e06"
BUS_ID = "00000000:00:06.0"
HOLDER = "/opt/torch/.venv/bin/python3 (pid 606)"
# What the real `nvidia-smi mig -lgip` printed for the H200 (MIG disabled): profile -> (ID, instances, memory GiB, SMs,
# decoders, encoders, copy engines, JPEG, OFA).
H200_PROFILES = {
    "1g.18gb": (19, 7, 16.00, 16, 1, 0, 1, 1, 0),
    "1g.18gb+me": (20, 1, 16.00, 16, 1, 0, 1, 1, 1),
    "1g.35gb": (15, 4, 32.50, 26, 1, 0, 1, 1, 0),
    "2g.35gb": (14, 3, 32.50, 32, 2, 0, 2, 2, 0),
    "3g.71gb": (9, 2, 69.75, 60, 3, 0, 3, 3, 0),
    "4g.71gb": (5, 1, 69.75, 64, 4, 0, 4, 4, 0),
    "7g.141gb": (0, 1, 140.00, 132, 7, 0, 8, 7, 1),
}


def real(name: str) -> str:
    return (REAL / name).read_text()


# ---- gpu_health ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["idle", "busy"])
def test_the_health_read_of_a_healthy_h200_is_healthy(phase):
    read = gh.split_read(real(f"health_read_{phase}.txt"))
    assert (read.smi_rc, read.kernel_source, read.pci) == (0, "dmesg", [(BUS_ID, "0x030200")])
    result = gh.verdict(read)
    assert (result["verdict"], result["action"], result["brief"]) == ("healthy", "none", "healthy")
    assert result["summary"] == "healthy: 1 GPU(s)"
    assert result["reasons"] == [] and result["notes"] == [] and result["xids"] == []
    assert result["unhealthy_gpus"] == []
    # The PCI bus and the driver agree: one GPU, none fallen off the bus.
    assert result["gpu_count"] == {"pci": 1, "driver": 1}
    assert result["driver_version"] == "580.159.04"
    assert result["gpus"] == [
        {
            "index": 0,
            "bus_id": BUS_ID,
            "uuid": UUID,
            "name": "NVIDIA H200",
            "verdict": "healthy",
            "action": "none",
            "findings": [],
        }
    ]


def test_driver_580_writes_the_v13_dtd_and_every_counter_the_verdict_reads_is_there():
    text = real("health_read_idle.txt")
    assert '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">' in text
    smi = gh.parse_smi_xml(gh.split_read(text).smi_output)
    assert (smi.driver_version, smi.cuda_version, smi.attached_gpus) == ("580.159.04", "13.0", 1)
    (gpu,) = smi.gpus
    # Read, not left at None: a counter the parser missed would make a faulty GPU look healthy.
    assert gpu.persistence_mode is True and gpu.ecc_enabled is True
    assert (gpu.uncorrectable_volatile, gpu.uncorrectable_aggregate, gpu.sram_threshold_exceeded) == (0, 0, False)
    assert (gpu.remapped_rows_correctable, gpu.remapped_rows_uncorrectable) == (0, 0)
    assert (gpu.remapped_rows_pending, gpu.remapped_rows_failure) == (False, False)
    assert (gpu.link_gen_current, gpu.link_gen_max, gpu.link_width_current, gpu.link_width_max) == (5, 5, 16, 16)
    assert gpu.slowdowns == []
    # An H200 retires no pages (it remaps rows): N/A, not judged.
    assert (gpu.retired_pages_sbe, gpu.retired_pages_dbe, gpu.retired_pages_pending) == (None, None, None)


def test_the_busy_health_read_lists_the_cuda_process_and_stays_healthy():
    text = real("health_read_busy.txt")
    assert "<pid>606</pid>" in text and "<pid>606</pid>" not in real("health_read_idle.txt")
    assert gh.judge(text)["verdict"] == "healthy"


# ---- gpu_mig ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["idle", "busy"])
def test_the_mig_read_finds_mig_disabled_and_the_seven_h200_profiles(phase):
    state = mig.read_state(real(f"mig_read_{phase}.txt"))
    assert state["smi"] is True and state["smi_error"] == ""
    (gpu,) = state["gpus"]
    assert (gpu["index"], gpu["uuid"], gpu["name"], gpu["device_id"]) == (0, UUID, "NVIDIA H200", "0x233510DE")
    assert (gpu["mig_current"], gpu["mig_pending"], gpu["memory_mib"]) == (False, False, 143771)
    # "No MIG-enabled devices found." (exit 0) for -lgi and -lci: no instance, and not an error.
    assert gpu["instances"] == []
    assert mig.current_devices(state) == {"gpus": 1, "full_gpus": 1, "mig_enabled_gpus": 0, "mig": {}}
    profiles = {
        name: (
            p["profile_id"],
            p["total"],
            p["memory_mib"] / 1024,
            p["multiprocessors"],
            p["decoders"],
            p["encoders"],
            p["copy_engines"],
            p["jpeg"],
            p["ofa"],
        )
        for name, p in gpu["profiles"].items()
    }
    assert profiles == H200_PROFILES
    assert all(p["free"] == p["total"] and p["p2p"] is False for p in gpu["profiles"].values())
    assert mig.find_model(gpu["device_id"]).name.startswith("H200-141GB")
    assert state["busy"] == ({UUID: [HOLDER]} if phase == "busy" else {})


def test_a_mig_layout_is_planned_on_the_idle_h200_and_held_back_on_the_busy_one():
    idle = mig.plan(mig.read_state(real("mig_read_idle.txt")), None, "all-balanced")
    assert (idle["changed"], idle["mode_change"], idle["busy"]) == (True, True, {})
    (gpu,) = idle["gpus"]
    assert gpu["action"] == "enable" and gpu["commands"] == [["nvidia-smi", "-i", "0", "-mig", "1"]]
    assert gpu["devices"] == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    busy = mig.plan(mig.read_state(real("mig_read_busy.txt")), None, "all-balanced")
    # The gpu_mig action holds a change back (and says why) when `busy` names a process on a GPU it would change.
    assert busy["changed"] is True and busy["busy"] == {"0": [HOLDER]}
    assert busy["gpus"][0]["busy"] == [HOLDER]
    # Leaving MIG disabled, as it is, is no change: nothing is held back.
    same = mig.plan(mig.read_state(real("mig_read_busy.txt")), None, "all-disabled")
    assert (same["changed"], same["busy"], same["gpus"][0]["commands"]) == (False, {}, [])


def test_the_h200_row_of_the_mig_table_agrees_with_the_real_driver():
    """The role's table (_mig.TABLE, written from NVIDIA's user guide) against `nvidia-smi mig -lgip` and `-lgipp` of
    a real H200: profile names, instance counts, placement starts and memory-slice sizes."""
    model = mig.find_model("0x233510DE")
    listed = {p["profile"]: p for p in mig.parse_lgip(real("mig_lgip.txt"))}
    placements = {}
    for line in real("mig_lgipp.txt").splitlines():
        match = re.fullmatch(r"GPU +0 Profile ID +(\d+) Placements? ?: \{([\d,]+)\}:(\d+)", line)
        assert match, line
        placements[int(match.group(1))] = (tuple(int(s) for s in match.group(2).split(",")), int(match.group(3)))
    assert len(placements) == 7
    assert set(model.profiles) == set(listed)
    for name, profile in model.profiles.items():
        starts, size = placements[listed[name]["profile_id"]]
        assert (profile.max_count, profile.starts, profile.memory) == (listed[name]["total"], starts, size), name
        assert profile.compute == mig.parse_profile(name)["g"], name
    # Memory slices are eighths of the GPU: a profile's memory is its share of the 7g profile's.
    whole = listed["7g.141gb"]["memory_mib"]
    for name, profile in model.profiles.items():
        assert listed[name]["memory_mib"] <= whole * profile.memory / model.slices, name
    assert (model.slices, model.compute) == (8, 7)


# ---- nvidia_driver ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["query_gpu_driver.csv", "query_gpu_driver_units.csv"])
def test_the_drivers_query_gpu_with_and_without_header_and_units(name):
    assert nd.smi_gpus(real(name)) == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "uuid": UUID,
            "memory_total_mib": 143771,
            "pci_bus_id": BUS_ID,
            "compute_capability": "9.0",
        }
    ]


def test_the_driver_read_finds_580_loaded_and_nvidia_smi_answering():
    node = nd.parse_read(real("driver_read.txt"))
    assert node.running == "6.18.44-fc-v657-gpu" and node.boot == []
    # This driver is not a package: no nvidia module under /lib/modules for modinfo, no headers.
    assert node.kernels == {"6.18.44-fc-v657-gpu": nd.Kernel(headers=False, module="")}
    assert node.loaded == "580.159.04" and nd.driver_branch(node.loaded) == "580"
    assert node.nouveau is False
    assert (node.persistenced_enabled, node.persistenced_active) == (False, False)
    assert (node.smi_answers, node.smi_rc, node.smi_fields) == (True, 0, list(nd.SMI_FIELDS))
    (gpu,) = nd.smi_gpus(node.smi_text, node.smi_fields)
    assert (gpu["name"], gpu["compute_capability"], gpu["memory_total_mib"]) == ("NVIDIA H200", "9.0", 143771)
    assert node.dpkg["python3"].present
    assert [name for name, info in node.dpkg.items() if name.startswith("nvidia-") and info.present] == []
    assert node.full is False and node.foreign == []


def test_the_loaded_version_of_the_open_kernel_module():
    assert nd.loaded_version(real("sys_module_nvidia_version.txt")) == "580.159.04"
    # "NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build": the open module words it so.
    assert nd.loaded_version(real("proc_driver_nvidia_version.txt")) == "580.159.04"


def test_the_h200_is_a_hopper_gpu_the_branch_supports():
    pci = mig.parse_pci(mig.split_sections(real("mig_read_idle.txt"))["pci"]["text"])
    assert pci == [{"pci_bus_id": "0000:00:06.0", "device_id": "0x233510DE", "index": 0}]
    assert nd.gpu_generation("10de:2335") == "Hopper"
    assert nd.gpu_support([{"device_id": "10de:2335"}], 580, "open") == []


# ---- service_config's GPU probe and the toolkit's links --------------------------------------------------------------

DEVICES = [
    ("/dev/nvidia-uvm", "238:0"),
    ("/dev/nvidia-uvm-tools", "238:1"),
    ("/dev/nvidia0", "195:0"),
    ("/dev/nvidiactl", "195:255"),
    ("/dev/nvidia-caps/nvidia-cap1", "241:1"),
    ("/dev/nvidia-caps/nvidia-cap2", "241:2"),
]


def test_a_daemon_reload_is_held_back_while_the_cuda_process_holds_the_gpu():
    probe = sc.parse_gpu_probe(real("gpu_probe_busy.txt"))
    # This VM has no /dev/char at all: every NVIDIA device lacks its link.
    assert [(d.path, d.number, d.linked) for d in probe.devices] == [(p, n, False) for p, n in DEVICES]
    assert probe.unlinked == [p for p, _n in DEVICES]
    (process,) = probe.processes
    assert (process.pid, process.command) == (606, "python3")
    assert set(process.devices) == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    }
    decision = sc.daemon_reload_decision(probe, drained=False)
    assert decision.allowed is False
    assert decision.as_result()["held_back"] is True
    warning = sc.daemon_reload_warning("containerd", decision)
    assert "python3 (pid 606)" in warning and "/dev/nvidia0" in warning
    assert sc.daemon_reload_decision(probe, drained=True).allowed is True


def test_a_daemon_reload_goes_ahead_on_the_idle_gpu():
    probe = sc.parse_gpu_probe(real("gpu_probe_idle.txt"))
    assert len(probe.devices) == 6 and probe.processes == ()
    decision = sc.daemon_reload_decision(probe, drained=False)
    assert decision.allowed is True and len(decision.unlinked) == 6


def test_the_toolkit_read_finds_the_devices_without_their_dev_char_links():
    node = nct.parse_read(real("toolkit_links.txt"))
    assert node.unlinked == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"]


# ---- validation ------------------------------------------------------------------------------------------------------


def test_the_validation_cells_of_the_real_answers():
    query = real("query_gpu_validation.csv")
    assert query == f"0, NVIDIA H200, {UUID}\n"
    assert gv.host_cell({"rc": 0, "stdout": query}, 1) == "ok (1 GPUs)"
    assert gv.host_cell({"rc": 0, "stdout": query}, 2) == "FAILED: nvidia-smi saw 1 of 2 GPUs"
    assert gv.container_cell({"rc": 0, "stdout": real("smi_L.txt")}) == "ok (1 GPUs)"


@pytest.mark.parametrize(
    ("action", "verdict", "fix"),
    [
        ("None", "healthy", "none"),
        ("Reset", "failed", "reset"),
        ("Drain and Reset", "failed", "reset"),
        ("Reboot", "failed", "reboot"),
        ("Drain P2P", "degraded", "reset"),
    ],
)
def test_driver_580_says_a_gpu_needs_a_reset_through_its_recovery_action(action, verdict, fix):
    """Driver 580's XML (DTD v13) has no <gpu_reset_status> any more: <gpu_recovery_action> ("None" on this healthy
    H200) is where the driver asks for a reset or a reboot. The real read, with that one element's value changed to
    each action NVIDIA documents (NVML_GPU_RECOVERY_ACTION_*)."""
    text = real("health_read_idle.txt")
    assert "<gpu_reset_status>" not in text and text.count("<gpu_recovery_action>None</gpu_recovery_action>") == 1
    result = gh.judge(text.replace("<gpu_recovery_action>None<", f"<gpu_recovery_action>{action}<"))
    assert (result["verdict"], result["action"]) == (verdict, fix)
    if action != "None":
        assert result["unhealthy_gpus"] == [BUS_ID]
        assert f"the driver's recovery action is {action}" in result["summary"]

"""GPU health: nvidia-smi's XML, the Xid catalogue, the PCI count and the verdict table.

The fixtures (fixtures/gpu_health/, see its README) are written from NVIDIA's documented formats; none is captured from
a GPU (no GPU machine was lent to this task).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.kubegpu.node.plugins.plugin_utils import _gpu_health as gh

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_health"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def read_of(
    smi: str = "", rc: int = 0, stderr: str = "", kernel: str = "", source: str = "journal", pci=None
) -> gh.NodeRead:
    lines = pci if pci is not None else []
    return gh.NodeRead(
        smi_rc=rc,
        smi_output=smi,
        smi_stderr=stderr,
        kernel_source=source,
        kernel_log=kernel,
        pci=[(gh.normalise_bus_id(a), c) for a, c in (line.split() for line in lines)],
    )


def pci_for(smi_xml: str) -> list[str]:
    return [f"{g.bus_id} 0x030200" for g in gh.parse_smi_xml(smi_xml).gpus]


def by_index(result: dict) -> dict:
    return {g["index"]: g for g in result["gpus"]}


# ----- the XML parser ---------------------------------------------------------------------------------------------


def test_healthy_parses_every_field_the_check_reads():
    smi = gh.parse_smi_xml(fixture("smi_healthy.xml"))
    assert (smi.driver_version, smi.cuda_version, smi.attached_gpus) == ("535.261.03", "12.2", 8)
    assert [g.index for g in smi.gpus] == list(range(8))
    first = smi.gpus[0]
    assert first.bus_id == "00000000:07:00.0"
    assert first.name == "NVIDIA A100-SXM4-80GB"
    assert first.persistence_mode is True
    assert first.ecc_enabled is True
    assert (first.uncorrectable_volatile, first.uncorrectable_aggregate) == (0, 0)
    assert first.sram_threshold_exceeded is False
    # A100s remap rows instead of retiring pages: nvidia-smi says N/A for retired pages.
    assert (first.retired_pages_sbe, first.retired_pages_dbe, first.retired_pages_pending) == (None, None, None)
    assert (first.remapped_rows_pending, first.remapped_rows_failure) == (False, False)
    assert (first.link_gen_current, first.link_gen_max, first.link_width_current, first.link_width_max) == (
        4,
        4,
        16,
        16,
    )
    assert first.slowdowns == []
    assert (first.reset_required, first.drain_and_reset_recommended) == (False, False)


def test_healthy_node_is_healthy_and_an_idle_link_is_only_a_note():
    xml = fixture("smi_healthy.xml")
    result = gh.verdict(read_of(xml, pci=pci_for(xml)))
    assert (result["verdict"], result["action"]) == ("healthy", "none")
    assert result["summary"] == "healthy: 8 GPU(s)"
    assert result["brief"] == "healthy"
    assert result["reasons"] == []
    assert result["gpu_count"] == {"pci": 8, "driver": 8}
    idle = by_index(result)[3]
    assert idle["verdict"] == "healthy"
    assert [f["severity"] for f in idle["findings"]] == ["info"]
    assert "gen 1 of 4" in idle["findings"][0]["text"]


def test_uncorrectable_ecc_since_the_driver_loaded_fails_the_gpu_and_the_node():
    xml = fixture("smi_ecc.xml")
    result = gh.verdict(read_of(xml, pci=pci_for(xml)))
    gpus = by_index(result)
    assert (gpus[2]["verdict"], gpus[2]["action"]) == ("failed", "reset")
    texts = [f["text"] for f in gpus[2]["findings"]]
    assert texts[0] == "2 uncorrectable ECC error(s) since the driver loaded (volatile)"
    assert "rows pending remapping: a GPU reset applies them" in texts
    assert "the driver recommends a drain and GPU reset" in texts
    # An uncorrectable error in an earlier driver load only: the rows were remapped, keep watching.
    assert (gpus[1]["verdict"], gpus[1]["action"]) == ("degraded", "watch")
    assert gpus[1]["findings"][0]["text"] == "1 uncorrectable ECC error(s) in the GPU's lifetime (aggregate)"
    assert (gpus[0]["verdict"], gpus[3]["verdict"]) == ("healthy", "healthy")
    assert (result["verdict"], result["action"]) == ("failed", "reset")
    assert result["unhealthy_gpus"] == ["00000000:0F:00.0", "00000000:47:00.0"]
    assert result["brief"] == "failed (reset): GPU 1, GPU 2"
    assert result["summary"].startswith(
        "failed (reset): 2 of 4 GPU(s): GPU 2 (00000000:47:00.0): 2 uncorrectable ECC error(s) since the driver"
    )
    assert result["reasons"][1].startswith("GPU 1 (00000000:0F:00.0): 1 uncorrectable")
    assert (
        "GPU 2 (00000000:47:00.0): 2 uncorrectable ECC error(s) since the driver loaded (volatile) -> reset"
        in (result["reasons"])
    )


def test_remapped_rows_failure_means_replace_and_pending_means_reset():
    result = gh.verdict(read_of(fixture("smi_remapped_rows.xml")))
    gpus = by_index(result)
    assert (gpus[0]["verdict"], gpus[0]["action"]) == ("failed", "replace")
    assert any("row remapping failed" in f["text"] for f in gpus[0]["findings"])
    assert any(f["text"] == "3 row(s) remapped after uncorrectable errors" for f in gpus[0]["findings"])
    assert (gpus[1]["verdict"], gpus[1]["action"]) == ("degraded", "reset")
    assert (result["verdict"], result["action"]) == ("failed", "replace")


def test_degraded_link_and_hardware_slowdowns_degrade_the_gpu():
    result = gh.verdict(read_of(fixture("smi_degraded_link.xml")))
    gpus = by_index(result)
    assert (gpus[1]["verdict"], gpus[1]["action"]) == ("degraded", "reboot")
    texts = [f["text"] for f in gpus[1]["findings"] if f["severity"] == "degraded"]
    assert texts[0].startswith("PCIe link at x8 of x16")
    assert [t for t in texts if t.startswith("clocks cut")] == [
        "clocks cut: " + gh.SLOWDOWN_REASONS["hw_slowdown"],
        "clocks cut: " + gh.SLOWDOWN_REASONS["hw_power_brake_slowdown"],
    ]
    # GPU 0 idles at gen 1 with persistence off: notes, not a verdict.
    assert gpus[0]["verdict"] == "healthy"
    assert {f["severity"] for f in gpus[0]["findings"]} == {"info"}
    assert any("persistence mode disabled" in f["text"] for f in gpus[0]["findings"])
    assert (result["verdict"], result["action"]) == ("degraded", "reboot")


def test_fallen_off_the_bus_counts_pci_against_the_driver():
    result = gh.verdict(
        read_of(
            fixture("smi_fallen_off.xml"),
            rc=15,
            stderr=fixture("smi_fallen_off_stderr.txt"),
            kernel=fixture("xid_fallen_off.log"),
            pci=fixture("pci_fallen_off.txt").split("\n")[:-1],
        )
    )
    assert result["gpu_count"] == {"pci": 4, "driver": 3}
    lost = next(g for g in result["gpus"] if g["bus_id"] == "00000000:47:00.0")
    assert (lost["index"], lost["verdict"], lost["action"]) == (None, "failed", "reboot")
    texts = [f["text"] for f in lost["findings"]]
    assert texts[0] == "on the PCI bus but not seen by the driver (fallen off the bus)"
    assert "nvidia-smi reports the GPU lost" in texts
    assert "Xid 79: GPU has fallen off the bus" in texts
    assert (result["verdict"], result["action"]) == ("failed", "reboot")
    assert result["unhealthy_gpus"] == ["00000000:47:00.0"]
    assert result["brief"] == "failed (reboot): GPU 00000000:47:00.0"
    assert [x["xid"] for x in result["xids"]] == [79]


def test_many_xids_are_each_mapped_to_their_meaning_and_action():
    events = gh.parse_xid_lines(fixture("xid_many.log"))
    assert len(events) == 17
    assert events[0].bus_id == "00000000:18:00.0"
    assert events[-1].bus_id == "00000000:BA:00.0"  # a dmesg line, with its [seconds] prefix
    assert {e.xid for e in events} == {13, 31, 43, 45, 48, 63, 74, 79, 92, 94, 95, 119, 137, 154} - {79}
    result = gh.verdict(read_of(kernel=fixture("xid_many.log"), smi="", rc=9, stderr="no driver"))
    by_xid = {(x["bus_id"][9:11], x["xid"]): x for x in result["xids"]}
    assert by_xid[("18", 13)]["count"] == 2 and by_xid[("18", 13)]["action"] == "application"
    assert by_xid[("2A", 94)]["action"] == "reset"
    assert by_xid[("3A", 48)]["meaning"].startswith("Double bit ECC error")
    assert by_xid[("3A", 154)]["action"] == "reset"
    assert by_xid[("5D", 154)]["action"] == "reboot"
    assert by_xid[("5D", 74)]["count"] == 2
    assert by_xid[("9A", 137)]["meaning"].endswith("see NVIDIA's Xid catalog")
    assert by_xid[("BA", 119)]["count"] == 2
    # No GPU is known to the driver here, so the Xids judge the node; the worst action is the reboot Xid 154 asks for.
    assert (result["verdict"], result["action"]) == ("failed", "reboot")


@pytest.mark.parametrize(
    ("xid", "text", "severity", "action"),
    [
        (13, "", "info", "application"),
        (31, "", "info", "application"),
        (43, "", "info", "application"),
        (45, "", "info", "application"),
        (68, "", "info", "application"),
        (48, "", "failed", "reset"),
        (63, "", "degraded", "reset"),
        (64, "", "failed", "replace"),
        (74, "", "failed", "reset"),
        (79, "", "failed", "reboot"),
        (92, "", "degraded", "watch"),
        (94, "", "degraded", "reset"),
        (95, "", "failed", "reset"),
        (154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", "info", "none"),
        (154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "failed", "reboot"),
        (154, "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", "failed", "reset"),
        (999, "", "degraded", "watch"),
    ],
)
def test_xid_catalogue(xid, text, severity, action):
    info = gh.xid_info(xid, text)
    assert (info.severity, info.action) == (severity, action)


def test_the_device_plugins_application_xids_never_degrade_a_gpu():
    # NVIDIA/k8s-device-plugin internal/rm/health.go skips exactly these: the GPU stays healthy.
    for xid in (13, 31, 43, 45, 68):
        assert gh.XID_CATALOGUE[xid].severity == "info"


def test_xids_land_on_their_gpu_and_can_be_ignored():
    xml = fixture("smi_healthy.xml")
    kernel = "kernel: NVRM: Xid (PCI:0000:0f:00): 48, pid=1, name=x, An uncorrectable double bit error (DBE)\n"
    result = gh.verdict(read_of(xml, kernel=kernel, pci=pci_for(xml)))
    assert (by_index(result)[1]["verdict"], result["verdict"]) == ("failed", "failed")
    ignored = gh.verdict(read_of(xml, kernel=kernel, pci=pci_for(xml)), ignore_xids=[48])
    assert ignored["verdict"] == "healthy"


def test_a_consumer_gpu_with_every_health_field_na_parses_and_is_healthy():
    smi = gh.parse_smi_xml(fixture("smi_geforce_na.xml"))
    gpu = smi.gpus[0]
    assert gpu.name == "NVIDIA GeForce RTX 4090"
    for name in (
        "ecc_enabled",
        "uncorrectable_volatile",
        "uncorrectable_aggregate",
        "retired_pages_sbe",
        "retired_pages_pending",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "reset_required",
    ):
        assert getattr(gpu, name) is None, name
    result = gh.verdict(read_of(fixture("smi_geforce_na.xml")))
    assert result["verdict"] == "healthy"
    assert result["driver_version"] == "550.163.01"


def test_driver_470_xml_with_its_older_element_names():
    xml = fixture("smi_v11_470.xml")
    gpu = gh.parse_smi_xml(xml).gpus[0]
    assert (gpu.uncorrectable_volatile, gpu.uncorrectable_aggregate) == (1, 1)
    assert (gpu.retired_pages_sbe, gpu.retired_pages_dbe, gpu.retired_pages_pending) == (1, 1, True)
    assert gpu.remapped_rows_pending is None
    assert gpu.slowdowns == ["hw_slowdown", "hw_thermal_slowdown"]
    assert gpu.reset_required is None
    result = gh.verdict(read_of(xml))
    only = result["gpus"][0]
    # The double bit error needs a reset, the page pending retirement a driver reload: the reboot covers both.
    assert (only["verdict"], only["action"]) == ("failed", "reboot")
    texts = [f["text"] for f in only["findings"]]
    assert "pages pending retirement: retired at the next driver reload" in texts
    assert "2 page(s) retired" in texts


def test_fields_left_out_entirely_parse_as_unknown():
    xml = '<nvidia_smi_log><driver_version>390.157</driver_version><gpu id="0000:01:00.0"></gpu></nvidia_smi_log>'
    smi = gh.parse_smi_xml(xml)
    assert smi.gpus[0].bus_id == "00000000:01:00.0"
    assert smi.gpus[0].index == 0
    assert gh.verdict(read_of(xml))["verdict"] == "healthy"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no <nvidia_smi_log>"),
        ("<nvidia_smi_log><gpu>", "cut off"),
        ("<nvidia_smi_log><gpu></nvidia_smi_log>", "does not parse"),
    ],
)
def test_broken_xml_is_an_error(text, message):
    with pytest.raises(gh.HealthReadError, match=message):
        gh.parse_smi_xml(text)


def test_no_driver_is_unknown_not_healthy():
    result = gh.verdict(
        read_of(
            rc=9,
            stderr="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            pci=["0000:07:00.0 0x030200"],
        )
    )
    assert (result["verdict"], result["action"]) == ("unknown", "none")
    assert result["summary"].startswith("unknown: 1 NVIDIA GPU(s) on the PCI bus; nvidia-smi exit 9: NVIDIA-SMI has")
    assert result["gpu_count"] == {"pci": 1, "driver": None}


def test_unparsable_xml_is_unknown_with_the_reason():
    result = gh.verdict(read_of(smi="<nvidia_smi_log><gpu>", rc=0))
    assert result["verdict"] == "unknown"
    assert "cut off" in result["summary"]


def test_an_unreadable_kernel_log_is_noted():
    result = gh.verdict(read_of(fixture("smi_healthy.xml"), source="none"))
    assert result["verdict"] == "healthy"
    assert "kernel log not readable: Xid events were not checked" in result["notes"]


def test_the_verdict_is_deterministic_and_json():
    xml = fixture("smi_ecc.xml")
    one = gh.verdict(read_of(xml, kernel=fixture("xid_many.log"), pci=pci_for(xml)))
    two = gh.verdict(read_of(xml, kernel=fixture("xid_many.log"), pci=pci_for(xml)))
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:3b:00.0", "00000000:3B:00.0"),
        ("00000000:3B:00.0", "00000000:3B:00.0"),
        ("3b:00.1", "00000000:3B:00.1"),
        ("not an address", "not an address"),
    ],
)
def test_bus_ids(text, expected):
    assert gh.normalise_bus_id(text) == expected


# ----- the read: the script's sections, and the script itself run by sh -----------------------------------------


def test_split_read_needs_the_end_marker():
    with pytest.raises(gh.HealthReadError, match="cut off"):
        gh.split_read("@@kubegpu-health smi\n<nvidia_smi_log>")


def test_split_read_of_an_unreadable_kernel_log_file():
    read = gh.split_read(
        "@@kubegpu-health smi\n@@kubegpu-health smi-stderr rc=127\nnvidia-smi: not found\n"
        "@@kubegpu-health kernel source=file\n@@unreadable /var/log/kern.log\n@@kubegpu-health pci\n"
        "@@kubegpu-health end\n"
    )
    assert (read.smi_rc, read.smi_stderr, read.kernel_source) == (127, "nvidia-smi: not found", "unreadable")


@pytest.fixture
def fake_node(tmp_path):
    """A folder standing in for the node: an nvidia-smi printing a fixture, a kernel log file, a sysfs PCI tree."""

    def make(xml: str, stderr: str = "", rc: int = 0, kernel: str = "", pci=()):
        smi = tmp_path / "nvidia-smi"
        (tmp_path / "smi.xml").write_text(xml)
        (tmp_path / "smi.err").write_text(stderr)
        smi.write_text(f'#!/bin/sh\ncat "{tmp_path}/smi.xml"\ncat "{tmp_path}/smi.err" >&2\nexit {rc}\n')
        smi.chmod(0o755)
        (tmp_path / "kern.log").write_text(kernel)
        devices = tmp_path / "pci"
        devices.mkdir(exist_ok=True)
        for address, vendor, klass in pci:
            device = devices / address
            device.mkdir()
            (device / "vendor").write_text(vendor + "\n")
            (device / "class").write_text(klass + "\n")
        return [str(smi), str(tmp_path / "kern.log"), str(devices), "1000"]

    return make


def run_script(args: list[str]) -> str:
    done = subprocess.run(
        ["sh", "-c", gh.READ_SCRIPT, "read", *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LC_ALL": "C"},
    )
    return done.stdout


def test_the_read_script_on_a_node_with_a_gpu_fallen_off(fake_node):
    args = fake_node(
        fixture("smi_fallen_off.xml"),
        stderr=fixture("smi_fallen_off_stderr.txt"),
        rc=15,
        kernel=fixture("xid_fallen_off.log"),
        pci=[
            ("0000:07:00.0", "0x10de", "0x030200"),
            ("0000:0f:00.0", "0x10de", "0x030200"),
            ("0000:47:00.0", "0x10de", "0x030200"),
            ("0000:4e:00.0", "0x10de", "0x030200"),
            ("0000:4f:00.0", "0x10de", "0x068000"),  # an NVSwitch bridge: not a GPU
            ("0000:00:02.0", "0x8086", "0x030000"),  # the board's own VGA controller
        ],
    )
    result = gh.judge(run_script(args))
    assert result["gpu_count"] == {"pci": 4, "driver": 3}
    assert result["kernel_log"] == "file"
    assert (result["verdict"], result["action"], result["unhealthy_gpus"]) == ("failed", "reboot", ["00000000:47:00.0"])


def test_the_read_script_without_nvidia_smi(fake_node, tmp_path):
    args = fake_node("", pci=[("0000:07:00.0", "0x10de", "0x030200")])
    args[0] = str(tmp_path / "no-such-nvidia-smi")
    result = gh.judge(run_script(args))
    assert result["verdict"] == "unknown"
    assert "nvidia-smi exit 127" in result["summary"]


def test_a_verdict_already_in_the_local_facts_is_not_written_again(fake_node, tmp_path):
    # issue 18: a no-op run wrote the verdict with ansible.builtin.copy (5 SSH round trips a host) to say nothing new.
    args = fake_node(fixture("smi_healthy.xml"), pci=[("0000:07:00.0", "0x10de", "0x030200")])
    facts = tmp_path / "facts"
    fact = facts / "nvidia_health.fact"

    def read() -> tuple[dict, str, bool]:
        return gh.judge_and_compare(run_script([*args, str(fact)]))

    health, content, current = read()
    assert health == gh.judge(run_script(args)) and health["verdict"] == "healthy"
    assert json.loads(content) == health and content.endswith("}\n")
    assert current is False  # no folder yet
    facts.mkdir(mode=0o755)
    facts.chmod(0o755)
    fact.write_text(content)
    fact.chmod(0o644)
    assert read()[2] is True
    fact.chmod(0o600)
    assert read()[2] is False  # the role gives it 0644: the copy must run to put that back
    fact.chmod(0o644)
    fact.write_text(content.replace('"healthy"', '"failed"', 1))
    assert read()[2] is False
    facts.chmod(0o700)
    fact.write_text(content)
    assert read()[2] is False


def test_the_role_writes_the_facts_file_as_the_comparison_expects():
    # facts_current compares with FACTS_DIR_OWNER and FACTS_FILE_OWNER; the role's file and copy tasks set them. Were
    # the two to differ, every run would find the file "not current" and write it again.
    tasks = yaml.safe_load(
        (Path(__file__).parents[4] / "roles" / "gpu_health" / "tasks" / "write_facts.yml").read_text()
    )
    folder = next(task["ansible.builtin.file"] for task in tasks if "ansible.builtin.file" in task)
    written = next(task["ansible.builtin.copy"] for task in tasks if "ansible.builtin.copy" in task)
    assert f"{folder['owner']} {folder['group']} {int(folder['mode'], 8):o}" == gh.FACTS_DIR_OWNER
    assert f"{written['owner']} {written['group']} {int(written['mode'], 8):o}" == gh.FACTS_FILE_OWNER
    assert written["content"] == "{{ __gpu_health_read.facts_content }}"


@pytest.mark.parametrize(
    ("fail_on", "failing"),
    [("none", set()), ("degraded", {"degraded", "failed"}), ("failed", {"failed"})],
)
def test_fail_on_names_the_verdicts_that_fail_the_role_and_never_unknown(fail_on, failing):
    for verdict in gh.VERDICTS:
        assert gh.fails({"verdict": verdict}, fail_on) is (verdict in failing), verdict


def test_a_fail_on_the_role_does_not_know_is_refused_with_the_roles_variable_named():
    with pytest.raises(ValueError, match=r"^gpu_health_fail_on must be none, degraded or failed, not sometimes\.$"):
        gh.fails({"verdict": "healthy"}, "sometimes")

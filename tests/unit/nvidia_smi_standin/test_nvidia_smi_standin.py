"""The nvidia-smi stand-in (tests/nvidia_smi_standin) answers as NVIDIA documents nvidia-smi and as a real driver 580
printed it on an H200 (fixtures/real/h200_580: compared byte for byte), and the gpu_mig planner reaches its layouts
through it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.kubegpu.node.plugins.action.gpu_mig import READ_SCRIPT
from ansible_collections.kubegpu.node.plugins.plugin_utils import _mig as mig

STANDIN = Path(__file__).resolve().parents[2] / "nvidia_smi_standin" / "nvidia_smi_standin.py"
FIXTURES = Path(__file__).resolve().parents[1] / "plugins" / "plugin_utils" / "fixtures" / "mig"
REAL = Path(__file__).resolve().parents[1] / "plugins" / "plugin_utils" / "fixtures" / "real" / "h200_580"
UUID0 = "GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0"
H200_UUID = "GPU-a5b8dffa-01a7-5ab4-0101-dde5c25f8e06"


@pytest.fixture
def smi(tmp_path):
    state_file = tmp_path / "state.json"

    def write(gpus, **extra):
        state_file.write_text(json.dumps({"gpus": gpus, **extra}))

    def run(*args, check=True):
        done = subprocess.run(
            [sys.executable, str(STANDIN), *args],
            capture_output=True,
            text=True,
            env={"NVIDIA_SMI_STANDIN_STATE": str(state_file)},
            check=False,
        )
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def state():
        return json.loads(state_file.read_text())

    run.write, run.state, run.file = write, state, state_file
    write([a100(0), {"index": 1, "uuid": "GPU-11111111-2222-3333-4444-555555555555", "model": "T4", "mig": {}}])
    return run


def a100(index, mig_on=True, gis=None, **extra):
    return {
        "index": index,
        "uuid": UUID0 if index == 0 else f"GPU-0000000{index}-6756-fd30-cd4a-1e6da3caf9b0",
        "model": "A100-SXM4-40GB",
        "mig": {"current": mig_on, "pending": mig_on},
        "gis": gis or [],
        **extra,
    }


def test_query_gpu_answers_the_fields_the_role_asks(smi):
    fields = ",".join(mig.QUERY_FIELDS)
    out = smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits").stdout
    assert out.splitlines() == [
        f"0, {UUID0}, NVIDIA A100-SXM4-40GB, 0x20B010DE, Enabled, Enabled, 40960",
        "1, GPU-11111111-2222-3333-4444-555555555555, Tesla T4, 0x1EB810DE, [N/A], [N/A], 15360",
    ]
    header = smi("--query-gpu=index,memory.total", "--format=csv").stdout.splitlines()
    assert header == ["index, memory.total [MiB]", "0, 40960 MiB", "1, 15360 MiB"]
    bad = smi("--query-gpu=index,colour", "--format=csv", check=False)
    assert bad.returncode == 2 and 'Field "colour" is not a valid field to query.' in bad.stdout


def test_listings_match_the_mig_user_guides_output(smi):
    # The guide's 3-2-1-1 geometry (GPU instances 7, 8, 4, 2) and its three 1c.3g.20gb compute instances in GI 1.
    guide_gis = [
        {"id": 7, "profile_id": 19, "start": 0, "size": 1, "cis": []},
        {"id": 8, "profile_id": 19, "start": 1, "size": 1, "cis": []},
        {"id": 4, "profile_id": 14, "start": 2, "size": 2, "cis": []},
        {"id": 2, "profile_id": 9, "start": 4, "size": 4, "cis": []},
    ]
    smi.write([a100(0, gis=guide_gis)])
    assert smi("mig", "-lgi").stdout == (FIXTURES / "lgi_a100_3211.txt").read_text()
    three = [{"id": i, "profile_id": 0} for i in range(3)]
    smi.write([a100(0, gis=[{"id": 1, "profile_id": 9, "start": 4, "size": 4, "cis": three}])])
    assert smi("mig", "-lci", "-gi", "1").stdout == (FIXTURES / "lci_a100_1c.txt").read_text()
    smi.write([a100(0)])
    # The guide's -lgip is an older driver's 79-column table; the stand-in prints driver 580's 81 columns (the real
    # H200 test below): the same rows, read by the same parser.
    lgip = smi("mig", "-lgip").stdout
    assert mig.parse_lgip(lgip) == mig.parse_lgip((FIXTURES / "lgip_a100_40gb.txt").read_text())
    assert {len(line) for line in lgip.splitlines()} == {81}
    assert smi("mig", "-lgipp").stdout.splitlines() == [
        "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1",
        "GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1",
        "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2",
        "GPU  0 Profile ID 14 Placements: {0,2,4}:2",
        "GPU  0 Profile ID  9 Placements: {0,4}:4",
        "GPU  0 Profile ID  5 Placement : {0}:4",
        "GPU  0 Profile ID  0 Placement : {0}:8",
    ]


def test_creating_instances_as_the_guide_does(smi):
    out = smi("mig", "-cgi", "9,3g.20gb", "-C").stdout.splitlines()
    assert out == [
        "Successfully created GPU instance ID  1 on GPU  0 using profile MIG 3g.20gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  1 using profile MIG 3g.20gb (ID  2)",
        "Successfully created GPU instance ID  2 on GPU  0 using profile MIG 3g.20gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  2 using profile MIG 3g.20gb (ID  2)",
    ]
    # Every memory slice is taken: no 1g.5gb fits any more, and the guide's message says so.
    full = smi("mig", "-cgi", "19", check=False)
    assert full.returncode != 0
    assert "Unable to create a GPU instance on GPU  0 using profile 19: Insufficient Resources" in full.stdout
    rows = {p["profile"]: p for p in mig.parse_lgip(smi("mig", "-lgip").stdout)}
    assert (rows["1g.5gb"]["free"], rows["3g.20gb"]["free"]) == (0, 0)


@pytest.mark.parametrize(
    ("profiles", "placements"),
    [
        # The MIG User Guide's examples: "-cgi 9,3g.20gb -C", the 3-2-1-1 and the 2-1-1-1-1-1 geometries.
        ("9,3g.20gb", [4, 0]),
        ("9,19,14,19", [4, 0, 2, 1]),
        ("14,19,19,19,19,19", [4, 6, 0, 1, 2, 3]),
    ],
)
def test_the_driver_places_instances_as_the_guide_shows(smi, profiles, placements):
    smi("mig", "-cgi", profiles)
    created = sorted(smi.state()["gpus"][0]["gis"], key=lambda gi: gi["id"])
    assert [gi["start"] for gi in created] == placements


def test_free_counts_follow_the_memory_slices(smi):
    smi("mig", "-cgi", "3g.20gb", "-C")
    rows = {p["profile"]: p for p in mig.parse_lgip(smi("mig", "-lgip").stdout)}
    # One 3g.20gb takes four of the eight memory slices (4 to 7): four 1g.5gb still fit (placements 0 to 3).
    assert (rows["1g.5gb"]["free"], rows["3g.20gb"]["free"], rows["7g.40gb"]["free"]) == (4, 1, 0)


def test_destroying_compute_then_gpu_instances(smi):
    smi("mig", "-cgi", "9,19", "-C")
    refused = smi("mig", "-dgi", check=False)
    assert "In use by another client" in refused.stdout and refused.returncode != 0
    assert smi("mig", "-i", "0", "-dci").stdout.splitlines() == [
        "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  1",
        "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  2",
    ]
    assert smi("mig", "-i", "0", "-dgi").stdout.splitlines() == [
        "Successfully destroyed GPU instance ID  1 from GPU  0",
        "Successfully destroyed GPU instance ID  2 from GPU  0",
    ]
    assert smi("mig", "-lgi", check=False).returncode == 6


def test_a_busy_gpu_refuses_changes(smi):
    smi("mig", "-cgi", "9", "-C")
    smi("--standin-process", "0", "4242", "python3")
    assert smi("--query-compute-apps=gpu_uuid,pid,process_name", "--format=csv,noheader").stdout.strip() == (
        f"{UUID0}, 4242, python3"
    )
    busy = smi("mig", "-dci", check=False)
    assert busy.returncode != 0 and "In use by another client" in busy.stdout


def test_mig_mode_is_made_current_by_a_reset_when_the_driver_can(smi):
    smi.write([a100(0, mig_on=False)])
    assert smi("-i", "0", "-mig", "1").stdout.splitlines() == ["Enabled MIG Mode for GPU 00000000:07:00.0", "All done."]
    assert smi.state()["gpus"][0]["mig"] == {"current": True, "pending": True}
    # Disabling with instances there is refused.
    smi("mig", "-cgi", "19", "-C")
    assert smi("-i", "0", "-mig", "0", check=False).returncode != 0


def test_mig_mode_stays_pending_where_no_reset_is_allowed(smi):
    smi.write([a100(0, mig_on=False, reset="refused")])
    out = smi("-i", "0", "-mig", "1").stdout.splitlines()
    assert out == [
        "Warning: MIG mode is in pending enable state for GPU 00000000:07:00.0:Not Supported",
        "Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective on GPU 00000000:07:00.0",
        "All done.",
    ]
    query = smi("--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader").stdout.strip()
    assert query == "Disabled, Enabled"
    assert smi("-i", "0", "--gpu-reset", check=False).stdout.strip() == (
        "Resetting GPU 00000000:07:00.0 is not supported."
    )
    # A reboot makes the pending mode current, and MIG instances never survive one.
    smi("--standin-reboot")
    assert smi.state()["gpus"][0]["mig"] == {"current": True, "pending": True}


def test_mig_mode_on_a_gpu_in_use_stays_pending_until_reset(smi):
    smi.write([a100(0, mig_on=False, processes=[{"pid": 7, "name": "dcgm"}])])
    assert "pending enable state" in smi("-i", "0", "-mig", "1").stdout
    assert smi("-i", "0", "-r", check=False).returncode != 0
    smi("--standin-no-processes")
    smi("-i", "0", "-r")
    assert smi.state()["gpus"][0]["mig"]["current"] is True


def test_without_a_driver_it_fails_as_nvidia_smi_does(smi):
    smi.write([a100(0)], driver_loaded=False)
    done = smi("-L", check=False)
    assert done.returncode == 9
    assert done.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")


def test_a_gpu_without_mig_refuses_mig_mode_and_a_reboot_leaves_it_alone(smi):
    done = smi("-i", "1", "-mig", "1", check=False)
    assert done.returncode == 3
    assert done.stdout.strip() == "Unable to enable MIG Mode for GPU 00000000:0F:00.0: Not Supported"
    smi("mig", "-cgi", "19", "-C")
    smi("--standin-reboot")
    assert [gpu.get("gis") for gpu in smi.state()["gpus"]] == [[], None]


def read_script_output(smi):
    """The role's own read script, run against the stand-in (as the gpu_mig action runs it on a node): its output."""
    bindir = smi.file.parent / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    wrapper.chmod(0o755)
    done = subprocess.run(
        ["sh", "-c", READ_SCRIPT, "read", str(wrapper)],
        capture_output=True,
        text=True,
        env={"NVIDIA_SMI_STANDIN_STATE": str(smi.file), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    return done.stdout


def read_through_standin(smi):
    return mig.read_state(read_script_output(smi))


def apply(smi, layout, layouts=None):
    """What the gpu_mig action does, minus Ansible: plan, mode commands, plan again, instance commands."""
    for _round in range(2):
        result = mig.plan(read_through_standin(smi), layouts, layout)
        for gpu in result["gpus"]:
            for argv in gpu["commands"]:
                smi(*argv[1:])
    return mig.plan(read_through_standin(smi), layouts, layout)


@pytest.mark.parametrize("layout", ["all-balanced", "all-1g.5gb", "all-7g.40gb", "all-disabled", "all-1g.5gb.me"])
def test_the_planner_reaches_each_layout_through_the_standin_and_then_does_nothing(smi, layout):
    smi.write([a100(0, mig_on=False), a100(1, gis=[{"id": 1, "profile_id": 0, "start": 0, "size": 8, "cis": []}])])
    final = apply(smi, layout)
    assert final["changed"] is False, final["gpus"]
    wanted = mig.wanted_per_gpu(mig.layout_entries(None, layout), final_gpus := read_through_standin(smi)["gpus"])
    for gpu in final_gpus:
        spec = wanted[gpu["index"]]
        assert gpu["mig_current"] is spec["enabled"]
        counts: dict[str, int] = {}
        for gi in gpu["instances"]:
            counts[gi["profile"]] = counts.get(gi["profile"], 0) + 1
            assert [ci["profile"] for ci in gi["cis"]] == [gi["profile"]]
        assert counts == spec["devices"]


def test_creation_tries_other_orders_when_the_driver_finds_no_room(smi):
    # A driver that takes the first free placement puts 3g.20gb at 0 and 2g.10gb at 4, 1g.5gb at 6: the second
    # 1g.5gb finds no room. Another order (as nvidia-mig-parted tries them) gets the balanced layout.
    smi.write([a100(0, placement="first-fit")])
    runs = []

    def run(argv):
        runs.append(argv)
        done = smi(*argv[1:], check=False)
        return done.returncode, done.stdout

    commands = mig.create_instances(0, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"], run)
    assert commands == runs
    assert commands[0][-2] == "3g.20gb,2g.10gb,1g.5gb,1g.5gb"
    assert ["nvidia-smi", "mig", "-i", "0", "-dci"] in commands
    counts: dict[str, int] = {}
    for gi in read_through_standin(smi)["gpus"][0]["instances"]:
        counts[gi["profile"]] = counts.get(gi["profile"], 0) + 1
    assert counts == {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}


def test_creation_gives_up_with_the_drivers_words(smi):
    smi.write([a100(0, placement="first-fit")])

    def run(argv):
        done = smi(*argv[1:], check=False)
        return done.returncode, done.stdout

    with pytest.raises(mig.MigError, match="Insufficient Resources"):
        mig.create_instances(0, ["7g.40gb", "1g.5gb"], run)


def h200(mig_on=False, processes=()):
    """The real H200 of fixtures/real/h200_580: MIG disabled, and in the busy capture python3 (pid 606) holding it."""
    return {
        "index": 0,
        "uuid": H200_UUID,
        "model": "H200",
        "pci_bus_id": "00000000:00:06.0",
        "mig": {"current": mig_on, "pending": mig_on},
        "gis": [],
        "processes": [{"pid": pid, "name": name} for pid, name in processes],
    }


DRIVER_FIELDS = "index,name,uuid,memory.total,pci.bus_id,compute_cap"


@pytest.mark.parametrize(
    ("args", "real"),
    [
        (["mig", "-lgip"], "mig_lgip.txt"),
        (["mig", "-lgipp"], "mig_lgipp.txt"),
        (["mig", "-lgi"], "mig_lgi.txt"),
        (["mig", "-lci"], "mig_lci.txt"),
        (["-L"], "smi_L.txt"),
        ([f"--query-gpu={DRIVER_FIELDS}", "--format=csv"], "query_gpu_driver_units.csv"),
        ([f"--query-gpu={DRIVER_FIELDS}", "--format=csv,noheader,nounits"], "query_gpu_driver.csv"),
        (["--query-gpu=index,name,uuid", "--format=csv,noheader"], "query_gpu_validation.csv"),
        (["--query-compute-apps=gpu_uuid,pid,process_name", "--format=csv,noheader"], "query_compute_apps_busy.csv"),
    ],
)
def test_the_h200_answers_byte_for_byte_what_the_real_one_printed(smi, args, real):
    """Every one of these exited 0 on the real H200 (MIG disabled), -lgi and -lci included."""
    smi.write([h200(processes=[(606, "/opt/torch/.venv/bin/python3")])])
    done = smi(*args, check=False)
    assert (done.returncode, done.stdout) == (0, (REAL / real).read_text())


def test_the_roles_read_through_the_h200_is_the_real_ones(smi):
    """The gpu_mig action's read script against the stand-in: each nvidia-smi section, exit code included, as the real
    H200 answered it while busy (the PCI section is this machine's sysfs, not the stand-in's)."""
    smi.write([h200(processes=[(606, "/opt/torch/.venv/bin/python3")])])
    ours = read_script_output(smi).split("@@kubegpu pci ")[0]
    assert ours == (REAL / "mig_read_busy.txt").read_text().split("@@kubegpu pci ")[0]


def test_profiles_are_listed_with_mig_disabled_and_instances_only_with_it_enabled(smi):
    smi.write([h200()])
    assert [p["profile"] for p in mig.parse_lgip(smi("mig", "-lgip").stdout)][-1] == "7g.141gb"
    # Creating needs MIG enabled, as before.
    refused = smi("mig", "-cgi", "19", "-C", check=False)
    assert (refused.returncode, refused.stdout.strip()) == (6, "No MIG-enabled devices found.")
    smi("-i", "0", "-mig", "1")
    empty = smi("mig", "-lgi", check=False)
    assert (empty.returncode, empty.stdout.strip()) == (6, "No GPU instances found: Not Found")
    smi("mig", "-cgi", "3g.71gb,3g.71gb", "-C")
    rows = {p["profile"]: p for p in mig.parse_lgip(smi("mig", "-lgip").stdout)}
    assert (rows["1g.18gb"]["free"], rows["3g.71gb"]["free"], rows["7g.141gb"]["free"]) == (0, 0, 0)
    assert [gi["profile"] for gi in mig.parse_lgi(smi("mig", "-lgi").stdout)] == ["3g.71gb", "3g.71gb"]


def test_the_planner_reaches_the_h200s_balanced_layout_through_the_standin(smi):
    smi.write([h200()])
    final = apply(smi, "all-balanced")
    assert final["changed"] is False, final["gpus"]
    (gpu,) = read_through_standin(smi)["gpus"]
    assert sorted(gi["profile"] for gi in gpu["instances"]) == ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]

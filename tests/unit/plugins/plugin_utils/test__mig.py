"""MIG: the profile table, fitting instances on a GPU, the layout file, nvidia-smi's output and the plan."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _mig as mig

FIXTURES = Path(__file__).parent / "fixtures" / "mig"
A100_40 = "0x20B010DE"
A100_80 = "0x20B210DE"
H100_80 = "0x233010DE"
H200 = "0x233510DE"
A30 = "0x20B710DE"
B200 = "0x290110DE"
T4 = "0x1EB810DE"


def model(pci_id):
    found = mig.find_model(pci_id)
    assert found is not None
    return found


# ---- the table: facts from NVIDIA's MIG User Guide (Supported MIG Profiles) and mig-parted's default config ------


@pytest.mark.parametrize(
    ("pci_id", "profile", "instances"),
    [
        # A30: 1g.6gb x4, 2g.12gb x2, 4g.24gb x1, a single +me.
        (A30, "1g.6gb", 4),
        (A30, "1g.6gb+me", 1),
        (A30, "2g.12gb", 2),
        (A30, "2g.12gb+me", 1),
        (A30, "4g.24gb", 1),
        # A100-SXM4-40GB (Table 6).
        (A100_40, "1g.5gb", 7),
        (A100_40, "1g.5gb+me", 1),
        (A100_40, "1g.10gb", 4),
        (A100_40, "2g.10gb", 3),
        (A100_40, "3g.20gb", 2),
        (A100_40, "4g.20gb", 1),
        (A100_40, "7g.40gb", 1),
        # A100-SXM4-80GB names and H100 (Table 7).
        (A100_80, "1g.10gb", 7),
        (H100_80, "1g.10gb", 7),
        (H100_80, "1g.20gb", 4),
        (H100_80, "2g.20gb", 3),
        (H100_80, "3g.40gb", 2),
        (H100_80, "4g.40gb", 1),
        (H100_80, "7g.80gb", 1),
        # H100 NVL (94GB) and H100 96GB / GH200 (mig-parted's default config).
        ("0x232110DE", "1g.12gb", 7),
        ("0x232110DE", "3g.47gb", 2),
        ("0x232110DE", "7g.94gb", 1),
        ("0x234210DE", "3g.48gb", 2),
        ("0x234210DE", "7g.96gb", 1),
        # H200 (Table 8).
        (H200, "1g.18gb", 7),
        (H200, "1g.35gb", 4),
        (H200, "2g.35gb", 3),
        (H200, "3g.71gb", 2),
        (H200, "7g.141gb", 1),
        # GH200 144GB, B200 (Table 9), GB200.
        ("0x234810DE", "1g.36gb", 4),
        (B200, "1g.23gb", 7),
        (B200, "1g.45gb", 4),
        (B200, "3g.90gb", 2),
        (B200, "7g.180gb", 1),
        ("0x294110DE", "7g.186gb", 1),
    ],
)
def test_each_documented_profile_fits_its_documented_count_and_no_more(pci_id, profile, instances):
    gpu = model(pci_id)
    assert gpu.profiles[profile].max_count == instances
    assert len(mig.fit(gpu, {profile: instances})) == instances
    with pytest.raises(mig.MigError, match=re.escape(f"at most {instances} instances of {profile}")):
        mig.fit(gpu, {profile: instances + 1})


def test_the_table_is_consistent():
    seen = set()
    for gpu in mig.TABLE:
        assert gpu.source
        assert not seen & set(gpu.device_ids), f"{gpu.name} repeats a device ID"
        seen |= set(gpu.device_ids)
        for name, profile in gpu.profiles.items():
            parsed = mig.parse_profile(name)
            assert parsed["g"] == profile.compute
            assert all(start + profile.memory <= gpu.slices for start in profile.starts)
        # The whole-GPU profile takes every slice; the balanced layout NVIDIA ships fits.
        assert max(p.memory for p in gpu.profiles.values()) == gpu.slices
        mig.fit(gpu, gpu.balanced)


def test_device_ids_in_every_notation():
    assert mig.device_id("0x20B010DE") == A100_40
    assert mig.device_id("10de:20b0") == A100_40
    assert mig.device_id("0x20b0") == A100_40
    assert mig.find_model("0x1EB810DE") is None  # Tesla T4: no MIG
    with pytest.raises(mig.MigError):
        mig.device_id("H100")


# ---- fitting ----------------------------------------------------------------------------------------------------


def test_the_guides_geometries_fit_and_larger_instances_come_first():
    a100 = model(A100_40)
    # 3-2-1-1 (the guide creates the 3g first) and 2-1-1-1-1-1.
    assert [p for p, _start in mig.fit(a100, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})] == [
        "3g.20gb",
        "2g.10gb",
        "1g.5gb",
        "1g.5gb",
    ]
    assert len(mig.fit(a100, {"2g.10gb": 1, "1g.5gb": 5})) == 6
    # 4 memory + 4 compute next to 4 memory + 3 compute (allowed since R510).
    assert mig.fit(a100, {"4g.20gb": 1, "3g.20gb": 1}) == [("4g.20gb", 0), ("3g.20gb", 4)]
    assert len(mig.fit(a100, {"2g.10gb": 3, "1g.5gb": 1})) == 4


@pytest.mark.parametrize(
    ("counts", "reason"),
    [
        ({"3g.20gb": 2, "1g.5gb": 1}, "without overlapping memory slices"),
        ({"1g.5gb": 7, "1g.10gb": 1}, "compute slices"),
        ({"4g.20gb": 1, "3g.20gb": 1, "1g.5gb": 1}, "compute slices"),
        ({"1g.10gb": 4, "1g.5gb": 1}, "without overlapping memory slices"),
        ({"1g.5gb+me": 2}, "at most 1 instances"),
        ({"1g.40gb": 1}, "has no MIG profile 1g.40gb"),
        ({"1c.3g.20gb": 2}, "compute-instance profiles"),
    ],
)
def test_what_an_a100_40gb_cannot_take_is_refused_with_the_reason(counts, reason):
    with pytest.raises(mig.MigError, match=reason):
        mig.fit(model(A100_40), counts)


def test_a30_has_four_slices():
    a30 = model(A30)
    assert len(mig.fit(a30, {"2g.12gb": 1, "1g.6gb": 2})) == 3
    with pytest.raises(mig.MigError):
        mig.fit(a30, {"2g.12gb": 2, "1g.6gb": 1})
    with pytest.raises(mig.MigError, match="media extensions"):
        mig.fit(a30, {"1g.6gb+me": 1, "2g.12gb+me": 1})


def test_resource_names_as_the_device_plugin_writes_them():
    assert mig.resource_name("1g.10gb") == "nvidia.com/mig-1g.10gb"
    assert mig.resource_name("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"


# ---- the layout file ----------------------------------------------------------------------------------------------

NVIDIA_EXAMPLE = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-1g.5gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}],
        "custom-config": [
            {"devices": [0, 1, 2, 3], "mig-enabled": False},
            {"devices": [4], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
            {"devices": [7], "mig-enabled": True, "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}},
        ],
    },
}


def test_mig_parteds_own_example_is_valid():
    assert mig.validate_layouts(NVIDIA_EXAMPLE) == []
    assert mig.validate_layouts(None) == []


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"version": "v2", "mig-configs": {"a": [{"devices": "all", "mig-enabled": False}]}}, "version: must be v1"),
        ({"version": "v1", "mig-configs": {}}, "at least one named layout"),
        ({"version": "v1", "mig-configs": {"a": []}}, "non-empty list"),
        ({"version": "v1", "mig-configs": {"a": [{"mig-enabled": False}]}}, "missing required field devices"),
        ({"version": "v1", "mig-configs": {"a": [{"devices": "some", "mig-enabled": False}]}}, "'all' or a list"),
        ({"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True}]}}, "'mig-devices' when"),
        (
            {
                "version": "v1",
                "mig-configs": {"a": [{"devices": "all", "mig-enabled": False, "mig-devices": {"1g.5gb": 1}}]},
            },
            "included when 'mig-enabled' is false",
        ),
        (
            {"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True, "mig_devices": {}}]}},
            "unexpected field mig_devices",
        ),
        (
            {
                "version": "v1",
                "mig-configs": {"a": [{"devices": "all", "mig-enabled": True, "mig-devices": {"big": 1}}]},
            },
            "is not a MIG profile name",
        ),
        (
            {
                "version": "v1",
                "mig-configs": {"a": [{"devices": "all", "device-filter": "H100", "mig-enabled": False}]},
            },
            "not a PCI device ID",
        ),
    ],
)
def test_layout_files_mig_parted_refuses_are_refused(config, problem):
    assert any(problem in p for p in mig.validate_layouts(config)), mig.validate_layouts(config)


def test_builtin_layouts_per_model():
    gpus = [{"index": 0, "device_id": A100_40}, {"index": 1, "device_id": H100_80}]
    wanted = mig.wanted_per_gpu(mig.layout_entries(None, "all-1g.10gb"), gpus)
    assert wanted[0]["devices"] == {"1g.10gb": 4}
    assert wanted[1]["devices"] == {"1g.10gb": 7}
    balanced = mig.wanted_per_gpu(mig.layout_entries(None, "all-balanced"), gpus)
    assert balanced[1]["devices"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    me = mig.wanted_per_gpu(mig.layout_entries(None, "all-1g.10gb.me"), gpus)
    assert me == {1: me[1]} and me[1]["devices"] == {"1g.10gb+me": 1}
    assert mig.wanted_per_gpu(mig.layout_entries(None, "all-disabled"), gpus)[0]["enabled"] is False
    with pytest.raises(mig.MigError, match="no MIG layout named 'half'"):
        mig.layout_entries(NVIDIA_EXAMPLE, "half")


def test_a_users_layout_wins_over_a_builtin_name_and_overlapping_entries_are_refused():
    config = {"version": "v1", "mig-configs": {"all-balanced": [{"devices": "all", "mig-enabled": False}]}}
    assert mig.layout_entries(config, "all-balanced") == [{"devices": "all", "mig-enabled": False}]
    overlapping = [
        {"devices": "all", "mig-enabled": False},
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.5gb": 1}},
    ]
    with pytest.raises(mig.MigError, match="matched by entries 0 and 1"):
        mig.wanted_per_gpu(overlapping, [{"index": 0, "device_id": A100_40}])


# ---- nvidia-smi's output ------------------------------------------------------------------------------------------


def test_query_gpu_csv():
    text = (
        "0, GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0, NVIDIA A100-SXM4-40GB, 0x20B010DE, Enabled, Enabled, 40960\n"
        "1, GPU-aaaaaaaa-6756-fd30-cd4a-1e6da3caf9b0, Tesla T4, 0x1EB810DE, [N/A], [N/A], 15360\n"
    )
    gpus = mig.parse_query(text)
    assert gpus[0]["mig_current"] is True and gpus[0]["device_id"] == A100_40 and gpus[0]["memory_mib"] == 40960
    assert gpus[1]["mig_current"] is None
    with pytest.raises(mig.MigError, match="values where 7 were asked"):
        mig.parse_query("0, GPU-x, A100\n")


def test_lgi_lci_lgip_from_the_guides_examples():
    gis = mig.parse_lgi((FIXTURES / "lgi_a100_3211.txt").read_text())
    assert [(g["profile"], g["id"], g["start"], g["size"]) for g in gis] == [
        ("1g.5gb", 7, 0, 1),
        ("1g.5gb", 8, 1, 1),
        ("2g.10gb", 4, 2, 2),
        ("3g.20gb", 2, 4, 4),
    ]
    cis = mig.parse_lci((FIXTURES / "lci_a100_1c.txt").read_text())
    assert [(c["gi"], c["profile"], c["id"]) for c in cis] == [(1, "1c.3g.20gb", i) for i in range(3)]
    profiles = mig.parse_lgip((FIXTURES / "lgip_a100_40gb.txt").read_text())
    assert [p["profile"] for p in profiles] == [
        "1g.5gb",
        "1g.5gb+me",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ]
    whole = profiles[-1]
    assert (whole["profile_id"], whole["total"], whole["multiprocessors"], whole["decoders"]) == (0, 1, 98, 5)
    assert (whole["copy_engines"], whole["jpeg"], whole["ofa"], whole["memory_mib"]) == (7, 1, 1, 40448)
    assert mig.parse_lgi("No GPU instances found: Not Found\n") == []


def sections(**parts):
    return "".join(f"@@kubegpu {name} {rc}\n{text}\n" for name, (rc, text) in parts.items())


def a100_state(mode="Enabled", pending=None, lgi="", lci="", apps=""):
    query = (
        f"0, GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0, NVIDIA A100-SXM4-40GB, 0x20B010DE, {mode}, "
        f"{pending or mode}, 40960\n"
    )
    return mig.read_state(sections(gpus=(0, query), apps=(0, apps), lgi=(0, lgi), lci=(0, lci), lgip=(0, "")))


LGI_TWO_3G = """
|   0  MIG 3g.20gb       9        1          4:4     |
+----------------------------------------------------+
|   0  MIG 3g.20gb       9        2          0:4     |
"""
LCI_TWO_3G = """
|   0      1       MIG 3g.20gb          2         0     |
|   0      2       MIG 3g.20gb          2         0     |
"""
LAYOUTS = {
    "version": "v1",
    "mig-configs": {
        "halves": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
        "mixed": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}}],
        "off": [{"devices": "all", "mig-enabled": False}],
    },
}


def test_read_state_joins_instances_to_their_gpu():
    state = a100_state(lgi=LGI_TWO_3G, lci=LCI_TWO_3G)
    assert state["smi"] is True
    gpu = state["gpus"][0]
    assert [(g["id"], g["start"], len(g["cis"])) for g in gpu["instances"]] == [(2, 0, 1), (1, 4, 1)]


def test_nothing_is_done_when_the_layout_is_there():
    result = mig.plan(a100_state(lgi=LGI_TWO_3G, lci=LCI_TWO_3G), LAYOUTS, "halves")
    assert result["changed"] is False
    assert result["gpus"][0]["commands"] == []
    assert result["devices"] == {"gpus": 1, "full_gpus": 0, "mig_enabled_gpus": 1, "mig": {"3g.20gb": 2}}


def test_a_new_layout_destroys_then_creates_largest_first():
    result = mig.plan(a100_state(lgi=LGI_TWO_3G, lci=LCI_TWO_3G), LAYOUTS, "mixed")
    gpu = result["gpus"][0]
    assert gpu["action"] == "reconfigure" and gpu["mode_change"] is False
    assert gpu["commands"] == [
        ["nvidia-smi", "mig", "-i", "0", "-dci"],
        ["nvidia-smi", "mig", "-i", "0", "-dgi"],
        ["nvidia-smi", "mig", "-i", "0", "-cgi", "3g.20gb,2g.10gb,1g.5gb,1g.5gb", "-C"],
    ]
    assert result["devices"]["mig"] == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}


def test_gpu_instances_a_cancelled_run_left_without_compute_instances_are_destroyed_alone():
    # -cgi ran, the run was cancelled before -cci: `nvidia-smi mig -dci` would find nothing and fail.
    result = mig.plan(a100_state(lgi=LGI_TWO_3G), LAYOUTS, "halves")
    assert result["gpus"][0]["commands"] == [
        ["nvidia-smi", "mig", "-i", "0", "-dgi"],
        ["nvidia-smi", "mig", "-i", "0", "-cgi", "3g.20gb,3g.20gb", "-C"],
    ]


def test_subdivided_compute_instances_are_not_the_layout():
    lgi = (
        "|   0  MIG 3g.20gb       9        1          4:4     |\n|   0  MIG 3g.20gb       9        2          0:4     |"
    )
    lci = (FIXTURES / "lci_a100_1c.txt").read_text() + "|   0      2       MIG 3g.20gb          2         0     |"
    result = mig.plan(a100_state(lgi=lgi, lci=lci), LAYOUTS, "halves")
    assert result["changed"] is True
    assert result["gpus"][0]["commands"][-1][-2:] == ["3g.20gb,3g.20gb", "-C"]


def test_enabling_mig_is_a_mode_change_alone():
    result = mig.plan(a100_state(mode="Disabled"), LAYOUTS, "halves")
    gpu = result["gpus"][0]
    assert gpu["action"] == "enable" and result["mode_change"] is True
    assert gpu["commands"] == [["nvidia-smi", "-i", "0", "-mig", "1"]]
    # What the node offers once the layout is complete.
    assert result["devices"]["mig"] == {"3g.20gb": 2}


def test_disabling_mig_destroys_the_instances_first():
    result = mig.plan(a100_state(lgi=LGI_TWO_3G, lci=LCI_TWO_3G), LAYOUTS, "off")
    assert result["gpus"][0]["commands"] == [
        ["nvidia-smi", "mig", "-i", "0", "-dci"],
        ["nvidia-smi", "mig", "-i", "0", "-dgi"],
        ["nvidia-smi", "-i", "0", "-mig", "0"],
    ]
    assert result["devices"] == {"gpus": 1, "full_gpus": 1, "mig_enabled_gpus": 0, "mig": {}}


def test_a_pending_mode_is_a_reset_the_node_needs():
    result = mig.plan(a100_state(mode="Disabled", pending="Enabled"), LAYOUTS, "halves")
    assert result["reset_required"] == [0]
    assert result["gpus"][0]["commands"] == []
    assert "reboot" in result["gpus"][0]["note"]
    # A pending change the layout does not want is taken back.
    back = mig.plan(a100_state(mode="Enabled", pending="Disabled", lgi=LGI_TWO_3G, lci=LCI_TWO_3G), LAYOUTS, "halves")
    assert back["gpus"][0]["commands"] == [["nvidia-smi", "-i", "0", "-mig", "1"]]


def test_a_busy_gpu_is_named_with_its_processes():
    apps = "GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0, 4242, python3\n"
    result = mig.plan(a100_state(lgi=LGI_TWO_3G, lci=LCI_TWO_3G, apps=apps), LAYOUTS, "mixed")
    assert result["busy"] == {"0": ["python3 (pid 4242)"]}
    assert mig.plan(a100_state(lgi=LGI_TWO_3G, lci=LCI_TWO_3G, apps=apps), LAYOUTS, "halves")["busy"] == {}


def test_a_layout_the_gpu_cannot_take_is_refused_before_anything():
    bad = {
        "version": "v1",
        "mig-configs": {"x": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]},
    }
    with pytest.raises(mig.MigError, match=r"GPU 0: .*at most 4 instances of 1g\.10gb"):
        mig.plan(a100_state(), bad, "x")
    with pytest.raises(mig.MigError, match=r"has no layout all-1g\.18gb"):
        mig.plan(a100_state(), None, "all-1g.18gb")


def test_gpus_without_mig():
    query = "0, GPU-11111111-2222-3333-4444-555555555555, Tesla T4, 0x1EB810DE, [N/A], [N/A], 15360\n"
    state = mig.read_state(
        sections(gpus=(0, query), apps=(0, ""), lgi=(6, "No MIG-enabled devices found."), lci=(6, ""))
    )
    # devices: all on a GPU without MIG is skipped, as mig-parted skips it.
    result = mig.plan(state, LAYOUTS, "halves")
    assert result["changed"] is False and result["devices"]["full_gpus"] == 1
    named = {"version": "v1", "mig-configs": {"x": [{"devices": [0], "mig-enabled": True, "mig-devices": {}}]}}
    with pytest.raises(mig.MigError, match="does not support MIG"):
        mig.plan(state, named, "x")


def test_before_the_driver_answers_the_layout_is_checked_against_the_pci_ids():
    pci = (
        "0000:07:00.0 0x10de 0x20b0 0x030200\n"
        "0000:0f:00.0 0x10de 0x20b0 0x030200\n"
        "0000:00:02.0 0x8086 0x1234 0x030000\n"
    )
    state = mig.read_state(sections(gpus=(9, "NVIDIA-SMI has failed because it couldn't communicate"), pci=(0, pci)))
    assert state["smi"] is False and [g["index"] for g in state["gpus"]] == [0, 1]
    result = mig.plan(state, LAYOUTS, "mixed")
    assert result["ready"] is False and result["changed"] is False
    assert result["devices"]["mig"] == {"1g.5gb": 4, "2g.10gb": 2, "3g.20gb": 2}
    with pytest.raises(mig.MigError):
        mig.plan(state, None, "all-1g.10gb.me.x")


# ---- what the device plugin advertises ----------------------------------------------------------------------------


def test_expected_resources_per_strategy():
    mixed_node = {"gpus": 2, "full_gpus": 1, "mig_enabled_gpus": 1, "mig": {"1g.10gb+me": 1, "3g.40gb": 2}}
    assert mig.expected_resources(mixed_node, "mixed") == {
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-1g.10gb.me": 1,
        "nvidia.com/mig-3g.40gb": 2,
    }
    with pytest.raises(mig.MigError, match="every GPU"):
        mig.expected_resources(mixed_node, "single")
    single_node = {"gpus": 2, "full_gpus": 0, "mig_enabled_gpus": 2, "mig": {"1g.10gb": 14}}
    assert mig.expected_resources(single_node, "single") == {"nvidia.com/gpu": 14}
    with pytest.raises(mig.MigError, match="strategy is none"):
        mig.expected_resources(single_node, "none")
    assert mig.expected_resources({"gpus": 4, "full_gpus": 4, "mig_enabled_gpus": 0, "mig": {}}, "none") == {
        "nvidia.com/gpu": 4
    }
    with pytest.raises(mig.MigError, match="one MIG profile per node"):
        mig.expected_resources({"full_gpus": 0, "mig_enabled_gpus": 1, "mig": {"1g.5gb": 1, "2g.10gb": 1}}, "single")


def test_creation_orders_start_with_the_plan_and_are_distinct():
    orders = mig.creation_orders(["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"])
    assert orders[0] == ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]
    assert len(orders) == 12  # 4! / 2!
    assert len({tuple(o) for o in orders}) == len(orders)
    assert len(mig.creation_orders(["1g.5gb"] * 7)) == 1
    assert len(mig.creation_orders([f"p{i}" for i in range(7)])) == mig.MAX_CREATION_ORDERS


def test_creation_stops_at_an_error_that_is_not_about_room():
    calls = []

    def run(argv):
        calls.append(argv)
        return 4, "Insufficient Permissions"

    with pytest.raises(mig.MigError, match="Insufficient Permissions"):
        mig.create_instances(0, ["3g.20gb", "1g.5gb"], run)
    assert len(calls) == 1


# The run's MIG strategy and each MIG node's resources (site.yml's private filters _gpu_mig_strategy and
# _gpu_mig_resources) -----------------------------------------------------------------------------------------------

NO_MIG = {"gpus": 4, "full_gpus": 4, "mig_enabled_gpus": 0, "mig": {}}
MIXED_NODE = {"gpus": 2, "full_gpus": 1, "mig_enabled_gpus": 1, "mig": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}
SINGLE_NODE = {"gpus": 2, "full_gpus": 0, "mig_enabled_gpus": 2, "mig": {"1g.10gb": 14}}


def test_auto_strategy_is_mixed_only_where_a_gpu_has_mig():
    assert mig.strategy_for({"a": NO_MIG}) == "none"
    assert mig.strategy_for({"a": NO_MIG, "b": MIXED_NODE}) == "mixed"
    assert mig.strategy_for({"a": NO_MIG}, "single") == "single"
    with pytest.raises(mig.MigError, match="auto, none, single or mixed"):
        mig.strategy_for({}, "all")
    # From the layout names the hosts ask for (site.yml's preflight, before any host changes).
    assert mig.strategy_for(["", "all-disabled"]) == "none"
    assert mig.strategy_for(["", "all-1g.10gb"]) == "mixed"
    with pytest.raises(mig.MigError, match="layout names or MIG devices"):
        mig.strategy_for("all-1g.10gb")
    with pytest.raises(mig.MigError, match="mapping of node name"):
        mig.resources_by_node([NO_MIG], "mixed")


def test_resources_per_mig_node():
    nodes = {"plain": NO_MIG, "mixed": MIXED_NODE, "single": SINGLE_NODE}
    assert mig.resources_by_node(nodes, "mixed") == {
        "mixed": {
            "nvidia.com/gpu": 1,
            "nvidia.com/mig-1g.10gb": 2,
            "nvidia.com/mig-2g.20gb": 1,
            "nvidia.com/mig-3g.40gb": 1,
        },
        "single": {"nvidia.com/mig-1g.10gb": 14},
    }
    assert mig.resources_by_node({"single": SINGLE_NODE}, "single") == {"single": {"nvidia.com/gpu": 14}}
    with pytest.raises(mig.MigError, match="mixed: the single MIG strategy needs MIG on every GPU"):
        mig.resources_by_node(nodes, "single")

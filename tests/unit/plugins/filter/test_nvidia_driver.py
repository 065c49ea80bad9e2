# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import base64
import shutil
import struct
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.kubegpu.node.plugins.filter.nvidia_driver import (
    FilterModule,
    compare_versions,
    driver_branch,
    gpu_generation,
    loaded_version,
    nvidia_driver_apt_source,
    nvidia_driver_branches,
    nvidia_driver_candidate,
    nvidia_driver_gpu_support,
    nvidia_driver_install_plan,
    nvidia_driver_kernels,
    nvidia_driver_madison,
    nvidia_driver_packages,
    nvidia_driver_pinned,
    nvidia_driver_preferences,
    nvidia_driver_reboot,
    nvidia_mok_enrolled,
    nvidia_pci_gpus,
    nvidia_secure_boot,
    nvidia_smi_gpus,
    upstream_version,
)

FIXTURES = Path(__file__).parent / "fixtures"
# /proc/driver/nvidia/version as the proprietary and the open modules write it.
PROC_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul 16 17:32:24 UTC 2025\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n"
)
PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)  Tue\n"
)


def test_registered():
    assert set(FilterModule().filters()) == {
        "nvidia_smi_gpus",
        "nvidia_pci_gpus",
        "nvidia_driver_packages",
        "nvidia_driver_branches",
        "nvidia_driver_candidate",
        "nvidia_driver_kernels",
        "nvidia_driver_reboot",
        "nvidia_driver_madison",
        "nvidia_driver_pinned",
        "nvidia_driver_install_plan",
        "nvidia_driver_preferences",
        "nvidia_driver_gpu_support",
        "nvidia_secure_boot",
        "nvidia_mok_enrolled",
        "nvidia_driver_loaded",
        "nvidia_driver_apt_source",
    }


# --- versions --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("package", "upstream"),
    [("535.261.03-1~deb12u1", "535.261.03"), ("1:550.163.01-2", "550.163.01"), ("580.95.05", "580.95.05")],
)
def test_upstream_version_drops_epoch_and_revision(package, upstream):
    assert upstream_version(package) == upstream


@pytest.mark.parametrize(
    ("left", "right", "result"),
    [
        ("535.54.03", "535.261.03", -1),  # as numbers, not as text ("54" > "261" as text)
        ("535.261.03", "535.261.03", 0),
        ("550.163.01", "535.261.03", 1),
        ("570.195.03", "570.86.10", 1),
        ("6.1.0-9-amd64", "6.1.0-28-amd64", -1),
    ],
)
def test_compare_versions(left, right, result):
    assert compare_versions(left, right) == result


def test_branch_of_a_version():
    assert driver_branch("535.261.03-1~deb12u1") == "535"
    assert driver_branch("") == ""


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("535.261.03\n", "535.261.03"),
        (PROC_PROPRIETARY, "535.261.03"),
        (PROC_OPEN, "580.95.05"),
        ("", ""),
        (None, ""),
        ("garbage", ""),
    ],
)
def test_loaded_version_from_sysfs_or_proc(text, version):
    assert loaded_version(text) == version


def test_branches_offered_newest_first():
    madison = ["550.163.01-2~bpo12+1", "535.261.03-1~deb12u1", "535.247.01-1~deb12u1", ""]
    assert nvidia_driver_branches(madison) == ["550", "535"]
    assert nvidia_driver_branches("580.95.05-1\n590.44.01-1\n") == ["590", "580"]


def test_candidate_is_the_newest_of_the_branch_never_a_newer_branch():
    versions = ["580.82.07-1", "590.44.01-1", "580.95.05-1", "580.105.08-0ubuntu1"]
    assert nvidia_driver_candidate(versions, 580) == "580.105.08-0ubuntu1"
    assert nvidia_driver_candidate(versions, "580", "580.95.05") == "580.95.05-1"
    assert nvidia_driver_candidate(versions, "580", "580.95.05-1") == "580.95.05-1"
    assert nvidia_driver_candidate(versions, "570") == ""
    assert nvidia_driver_candidate(versions, "580", "580.1.1") == ""


# --- kernels ---------------------------------------------------------------------------------------------------------


def test_kernels_default_to_running_and_newest_installed():
    result = nvidia_driver_kernels(["6.1.0-9-amd64", "6.1.0-28-amd64", "6.1.0-10-amd64"], "6.1.0-10-amd64")
    assert result == {"kernels": ["6.1.0-10-amd64", "6.1.0-28-amd64"], "next_boot": "6.1.0-28-amd64"}


def test_kernels_running_is_newest():
    assert nvidia_driver_kernels(["6.1.0-28-amd64"], "6.1.0-28-amd64")["kernels"] == ["6.1.0-28-amd64"]


def test_kernels_asked_for_win():
    result = nvidia_driver_kernels(["6.1.0-28-amd64"], "6.8.0-host", ["6.1.0-50-amd64"])
    assert result == {"kernels": ["6.1.0-50-amd64"], "next_boot": "6.1.0-50-amd64"}


def test_no_kernel_at_all_is_an_error():
    with pytest.raises(AnsibleFilterError, match="no kernel"):
        nvidia_driver_kernels([], "")


# --- package naming --------------------------------------------------------------------------------------------------


def test_debian_proprietary_headless():
    result = nvidia_driver_packages("535", "distribution", "Debian")
    assert result["packages"] == [
        "nvidia-kernel-dkms",
        "nvidia-smi",
        "libcuda1",
        "libnvidia-ml1",
        "firmware-nvidia-gsp",
        "nvidia-persistenced",
    ]
    assert result["kernel_package"] == "nvidia-kernel-dkms" and result["dkms"] and result["pinning"] == []
    assert "nvidia-driver" not in result["packages"]  # the metapackage pulls X11


def test_debian_open_without_persistenced_and_with_x():
    packages = nvidia_driver_packages(550, "distribution", "Debian", "open", persistenced=False, headless=False)
    assert packages["packages"][0] == "nvidia-open-kernel-dkms"
    assert "nvidia-persistenced" not in packages["packages"] and "nvidia-driver" in packages["packages"]


def test_debian_before_gsp_firmware():
    assert "firmware-nvidia-gsp" not in nvidia_driver_packages(470)["packages"]


def test_ubuntu_server_packages_and_precompiled_modules():
    result = nvidia_driver_packages("570", "distribution", "Ubuntu", kernels=["6.8.0-45-generic"])
    assert result["packages"] == [
        "nvidia-headless-no-dkms-570-server",
        "nvidia-utils-570-server",
        "nvidia-dkms-570-server",
    ]
    assert result["precompiled"] == ["linux-modules-nvidia-570-server-6.8.0-45-generic"]
    open_ = nvidia_driver_packages("570", "distribution", "Ubuntu", "open", kernels=["6.8.0-45-generic"])
    assert open_["precompiled"] == ["linux-modules-nvidia-570-server-open-6.8.0-45-generic"]
    assert open_["kernel_package"] == "nvidia-dkms-570-server-open"


@pytest.mark.parametrize("source", ["cuda", "mirror"])
def test_cuda_on_debian_is_the_compute_set_held_by_the_pinning_package(source):
    result = nvidia_driver_packages("580", source, "Debian")
    assert result["pinning"] == ["nvidia-driver-pinning-580"]
    assert result["packages"] == ["nvidia-driver-cuda", "nvidia-kernel-dkms", "nvidia-persistenced"]
    assert result["kernel_package"] == "nvidia-kernel-dkms"
    full = nvidia_driver_packages("580", source, "Debian", "open", headless=False)
    assert (
        full["packages"] == ["nvidia-open-580", "nvidia-persistenced"] and full["kernel_package"] == "nvidia-open-580"
    )
    assert nvidia_driver_packages("580", source, headless=False)["packages"][0] == "cuda-drivers-580"
    assert nvidia_driver_packages("590", source, headless=False)["packages"][0] == "cuda-drivers"


def test_cuda_on_ubuntu_names_the_branch_until_590():
    assert nvidia_driver_packages("580", "cuda", "Ubuntu", "open")["packages"] == [
        "nvidia-headless-no-dkms-580-open",
        "nvidia-utils-580",
        "nvidia-dkms-580-open",
        "nvidia-persistenced",
    ]
    result = nvidia_driver_packages("590", "cuda", "Ubuntu")
    assert result["packages"][:3] == ["nvidia-headless-no-dkms", "nvidia-utils", "nvidia-dkms"]
    assert result["pinning"] == ["nvidia-driver-pinning-590"]


def test_cuda_590_open_modules():
    result = nvidia_driver_packages("590", "cuda", "Debian", "open")
    assert result["packages"] == ["nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced"]
    assert result["pinning"] == ["nvidia-driver-pinning-590"]


def test_cuda_before_pinning_packages():
    assert nvidia_driver_packages("570", "cuda")["pinning"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("latest",), "branch is a number"),
        (("535", "nvidia"), "source must be one of"),
        (("535", "distribution", "Debian", "closed"), "flavour must be one of"),
        (("535", "distribution", "RedHat"), "use source cuda or mirror"),
    ],
)
def test_package_naming_refuses_what_it_does_not_know(args, message):
    with pytest.raises(AnsibleFilterError, match=message):
        nvidia_driver_packages(*args)


# --- GPUs ------------------------------------------------------------------------------------------------------------


def test_smi_csv_with_header_and_nounits():
    gpus = nvidia_smi_gpus((FIXTURES / "nvidia_smi_query_gpu.csv").read_text())
    assert len(gpus) == 4
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA A100-SXM4-80GB",
        "uuid": "GPU-4f6a1c9e-2b7d-4c1a-9e5f-0d3b8a7c6e21",
        "memory_total_mib": 81920,
        "pci_bus_id": "00000000:07:00.0",
        "compute_capability": "8.0",
    }
    assert gpus[2]["name"] == "Tesla P4" and gpus[2]["compute_capability"] == "6.1"
    assert gpus[3]["compute_capability"] is None  # [N/A]


def test_smi_csv_with_units():
    (gpu,) = nvidia_smi_gpus((FIXTURES / "nvidia_smi_query_gpu_units.csv").read_text())
    assert gpu["memory_total_mib"] == 15360 and gpu["name"] == "Tesla T4"


def test_smi_csv_without_compute_cap_from_an_old_driver():
    fields = ["index", "name", "uuid", "memory.total", "pci.bus_id"]
    (gpu,) = nvidia_smi_gpus("0, Tesla K80, GPU-abc, 11441, 00000000:04:00.0\n", fields)
    assert gpu["compute_capability"] is None and gpu["memory_total_mib"] == 11441


def test_smi_csv_no_gpu_is_empty():
    assert nvidia_smi_gpus("") == []


def test_smi_csv_with_a_short_line_is_an_error():
    with pytest.raises(AnsibleFilterError, match="line 1 has 2 values, 6 expected"):
        nvidia_smi_gpus("0, Tesla T4\n")


def test_pci_gpus_keep_nvidia_display_and_3d_controllers_only():
    sysfs = (
        "0000:00:02.0 0x8086 0x9bc8 0x030000\n"  # Intel graphics
        "0000:86:00.0 0x10de 0x1bb3 0x030200\n"  # Tesla P4, 3D controller
        "0000:07:00.0 0x10de 0x20b2 0x030200\n"  # A100
        "0000:07:00.1 0x10de 0x10f0 0x040300\n"  # an NVIDIA HDMI audio function
        "broken line\n"
    )
    assert nvidia_pci_gpus(sysfs) == [
        {"pci_bus_id": "0000:07:00.0", "device_id": "10de:20b2"},
        {"pci_bus_id": "0000:86:00.0", "device_id": "10de:1bb3"},
    ]


# --- reboot decision -------------------------------------------------------------------------------------------------


def test_nothing_loaded_loads_without_reboot():
    result = nvidia_driver_reboot("535.261.03-1~deb12u1", "", False, True)
    assert result["action"] == "load" and result["reboot_required"] is False


def test_nothing_loaded_and_no_gpu_skips_loading():
    result = nvidia_driver_reboot("535.261.03", "", False, False)
    assert result["action"] == "skip" and result["reboot_required"] is False


def test_same_version_loaded_needs_nothing():
    result = nvidia_driver_reboot("535.261.03", PROC_PROPRIETARY)
    assert result == {
        "action": "none",
        "reboot_required": False,
        "reason": "nvidia 535.261.03 is loaded and installed",
    }


@pytest.mark.parametrize("loaded", ["530.30.02\n", "550.163.01", "535.247.01"])
def test_another_version_loaded_needs_a_reboot(loaded):
    result = nvidia_driver_reboot("535.261.03", loaded)
    assert result["action"] == "reboot" and result["reboot_required"] is True
    assert "535.261.03 is installed" in result["reason"]


def test_nouveau_loaded_needs_a_reboot_even_with_nothing_else_loaded():
    result = nvidia_driver_reboot("535.261.03", "", nouveau_loaded=True)
    assert result["action"] == "reboot" and "nouveau" in result["reason"]


def test_nothing_built_for_the_next_boot_decides_nothing():
    assert nvidia_driver_reboot("", "535.261.03")["action"] == "none"


# --- what a source offers, and what is installed from it ------------------------------------------------------------

# The role's probe of Debian 12 (bookworm and bookworm-security), as "package|version" lines.
BOOKWORM_PROBE = """nvidia-kernel-dkms|535.309.01-0+deb12u1
nvidia-kernel-dkms|535.261.03-1
libcuda1|535.309.01-0+deb12u1
libcuda1|535.261.03-1
nvidia-persistenced|535.171.04-1~deb12u1
"""


def test_madison_lines():
    offered = nvidia_driver_madison(BOOKWORM_PROBE + "garbage\n")
    assert offered["nvidia-kernel-dkms"] == ["535.309.01-0+deb12u1", "535.261.03-1"]
    assert offered["nvidia-persistenced"] == ["535.171.04-1~deb12u1"]
    assert set(offered) == {"nvidia-kernel-dkms", "libcuda1", "nvidia-persistenced"}


def test_pinned_versions_follow_the_exact_version_and_leave_others_alone():
    offered = nvidia_driver_madison(BOOKWORM_PROBE)
    packages = ["nvidia-kernel-dkms", "libcuda1", "nvidia-persistenced", "nvidia-cuda-mps"]
    assert nvidia_driver_pinned(packages, offered, "535", "535.261.03") == [
        "nvidia-kernel-dkms=535.261.03-1",
        "libcuda1=535.261.03-1",
        "nvidia-persistenced=535.171.04-1~deb12u1",  # versioned apart: the newest of the branch
        "nvidia-cuda-mps",  # not offered by the probe: apt picks
    ]
    assert nvidia_driver_pinned(packages[:1], offered, "535")[0] == "nvidia-kernel-dkms=535.309.01-0+deb12u1"


def test_a_newer_branch_in_the_same_source_is_never_pinned():
    offered = {"cuda-drivers-580": ["580.95.05-1"], "nvidia-driver-cuda": ["590.44.01-1", "580.95.05-1"]}
    assert nvidia_driver_pinned(["nvidia-driver-cuda"], offered, "580") == ["nvidia-driver-cuda=580.95.05-1"]


# --- what is left to install and hold (dpkg-query -W -f='${Package}|${Version}|${Status}\n' NAMES...) -------------

# The packages the molecule scenario nvidia_driver_cuda plans (source cuda, branch 580), as the role passes them.
CUDA_PLANNED = [
    "nvidia-driver-pinning-580=580.95.05-1",
    "nvidia-driver-cuda=580.95.05-1",
    "nvidia-kernel-dkms=580.95.05-1",
    "nvidia-persistenced=580.95.05-1",
]
CUDA_NAMES = [entry.partition("=")[0] for entry in CUDA_PLANNED]
# dpkg-query on a node where the role ran: every package installed at the branch's version and held (the order is
# dpkg's, by name, not the order asked for).
CUDA_CONVERGED = (
    "nvidia-driver-cuda|580.95.05-1|hold ok installed\n"
    "nvidia-driver-pinning-580|580.95.05-1|hold ok installed\n"
    "nvidia-kernel-dkms|580.95.05-1|hold ok installed\n"
    "nvidia-persistenced|580.95.05-1|hold ok installed\n"
)


def test_a_node_without_the_driver_installs_and_holds_everything():
    # dpkg-query prints nothing on stdout (rc 1, "no packages found matching" on stderr).
    assert nvidia_driver_install_plan("", CUDA_PLANNED) == {"install": CUDA_PLANNED, "to_hold": CUDA_NAMES}


def test_a_converged_node_needs_neither_apt_nor_dpkg():
    assert nvidia_driver_install_plan(CUDA_CONVERGED, CUDA_PLANNED) == {"install": [], "to_hold": []}


def test_installed_but_not_held_needs_only_the_holds():
    released = CUDA_CONVERGED.replace("nvidia-kernel-dkms|580.95.05-1|hold", "nvidia-kernel-dkms|580.95.05-1|install")
    assert nvidia_driver_install_plan(released, CUDA_PLANNED) == {"install": [], "to_hold": ["nvidia-kernel-dkms"]}


def test_another_version_is_installed_again_at_the_planned_one():
    older = CUDA_CONVERGED.replace("nvidia-driver-cuda|580.95.05-1", "nvidia-driver-cuda|580.82.07-1").replace(
        "nvidia-persistenced|580.95.05-1", "nvidia-persistenced|590.44.01-1"
    )
    plan = nvidia_driver_install_plan(older, CUDA_PLANNED)
    assert plan["install"] == ["nvidia-driver-cuda=580.95.05-1", "nvidia-persistenced=580.95.05-1"]
    # Still held now; the role holds them again after apt changed them (apt releases the hold of what it changes).
    assert plan["to_hold"] == []


@pytest.mark.parametrize(
    "status",
    [
        "deinstall ok config-files",  # removed, its configuration files left
        "install reinstreq half-installed",  # an installation that failed half way
        "install ok unpacked",  # unpacked, not configured
        "install ok half-configured",
        "unknown ok not-installed",  # known to dpkg (from an available file) but never installed
    ],
)
def test_a_package_not_fully_installed_is_installed(status: str):
    text = f"nvidia-kernel-dkms|{'' if 'not-installed' in status else '580.95.05-1'}|{status}\n"
    plan = nvidia_driver_install_plan(text, ["nvidia-kernel-dkms=580.95.05-1"])
    assert plan == {"install": ["nvidia-kernel-dkms=580.95.05-1"], "to_hold": ["nvidia-kernel-dkms"]}


def test_a_package_marked_for_removal_but_installed_is_in_place():
    # apt's test is dpkg's current state, not the selection: "deinstall ok installed" is installed.
    plan = nvidia_driver_install_plan("libcuda1|580.95.05-1|deinstall ok installed\n", ["libcuda1=580.95.05-1"])
    assert plan == {"install": [], "to_hold": ["libcuda1"]}


def test_epochs_are_part_of_the_version():
    text = "libnvidia-compute|1:580.95.05-1|hold ok installed\n"
    assert nvidia_driver_install_plan(text, ["libnvidia-compute=1:580.95.05-1"])["install"] == []
    # apt's "name=580.95.05-1" is not the installed "1:580.95.05-1" (epoch 0 against 1): apt must decide.
    assert nvidia_driver_install_plan(text, ["libnvidia-compute=580.95.05-1"])["install"] == [
        "libnvidia-compute=580.95.05-1"
    ]


def test_a_bare_name_needs_only_to_be_installed():
    text = "nvidia-cuda-mps|535.171.04-1~deb12u1|install ok installed\n"
    assert nvidia_driver_install_plan(text, ["nvidia-cuda-mps", "nvidia-smi"]) == {
        "install": ["nvidia-smi"],
        "to_hold": ["nvidia-cuda-mps", "nvidia-smi"],
    }


def test_names_dpkg_query_does_not_list_are_left_to_apt():
    # A virtual package or an architecture-qualified name: dpkg-query lists another name (or none); apt decides.
    text = "libcuda1|580.95.05-1|hold ok installed\n"
    plan = nvidia_driver_install_plan(text, ["libcuda1:i386=580.95.05-1", "libcuda-so"])
    assert plan == {"install": ["libcuda1:i386=580.95.05-1", "libcuda-so"], "to_hold": ["libcuda1:i386", "libcuda-so"]}


def test_planned_packages_are_a_list():
    assert nvidia_driver_install_plan(CUDA_CONVERGED, CUDA_PLANNED + CUDA_PLANNED[:1])["install"] == []
    with pytest.raises(AnsibleFilterError, match="list of packages"):
        nvidia_driver_install_plan(CUDA_CONVERGED, "nvidia-kernel-dkms=580.95.05-1")


@pytest.mark.skipif(not shutil.which("dpkg-query"), reason="needs dpkg-query")
def test_real_dpkg_query_output(tmp_path: Path):
    """The role's own query, run by dpkg-query over a dpkg database with each state the plan tells apart."""
    stanzas = [
        ("nvidia-driver-pinning-580", "580.95.05-1", "hold ok installed"),
        ("nvidia-driver-cuda", "580.82.07-1", "hold ok installed"),
        ("nvidia-kernel-dkms", "1:580.95.05-1", "install reinstreq half-installed"),
        ("libcuda1", "580.95.05-1", "deinstall ok config-files"),
        ("nvidia-persistenced", "580.95.05-1", "install ok installed"),
    ]
    (tmp_path / "updates").mkdir()
    (tmp_path / "status").write_text(
        "\n".join(
            f"Package: {name}\nStatus: {status}\nMaintainer: t <t@example.org>\nArchitecture: amd64\n"
            f"Version: {version}\nDescription: t\n"
            for name, version, status in stanzas
        ),
        encoding="utf-8",
    )
    planned = [
        "nvidia-driver-pinning-580=580.95.05-1",
        "nvidia-driver-cuda=580.95.05-1",
        "nvidia-kernel-dkms=1:580.95.05-1",
        "libcuda1=580.95.05-1",
        "nvidia-persistenced=580.95.05-1",
        "nvidia-smi=580.95.05-1",
    ]
    names = [entry.partition("=")[0] for entry in planned]
    query = subprocess.run(
        ["dpkg-query", f"--admindir={tmp_path}", "-W", "-f=${Package}|${Version}|${Status}\n", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    assert query.returncode == 1  # nvidia-smi is not known: the role accepts 1
    assert nvidia_driver_install_plan(query.stdout, planned) == {
        "install": [
            "nvidia-driver-cuda=580.95.05-1",
            "nvidia-kernel-dkms=1:580.95.05-1",
            "libcuda1=580.95.05-1",
            "nvidia-smi=580.95.05-1",
        ],
        "to_hold": ["nvidia-kernel-dkms", "libcuda1", "nvidia-persistenced", "nvidia-smi"],
    }


def test_preferences_pin_the_branch_or_the_version():
    assert "Pin: version 535.*\n" in nvidia_driver_preferences("535")
    text = nvidia_driver_preferences("535", "535.261.03-1")
    assert "Pin: version 535.261.03*\n" in text and "Pin-Priority: 1001" in text
    assert "Package: /^(nvidia-|libnvidia-|libcuda|cuda-drivers" in text


# --- support warnings and Secure Boot --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "generation"),
    [("10de:1bb3", "Pascal"), ("10de:1db4", "Volta"), ("10de:1eb8", "Turing"), ("10de:20b2", "Ampere"),
     ("10de:2330", "Hopper"), ("10de:2901", "Blackwell"), ("10de:0fff", "")],
)  # fmt: skip
def test_gpu_generation(device_id, generation):
    assert gpu_generation(device_id) == generation


def test_support_warnings_name_the_devices():
    gpus = [{"pci_bus_id": "0000:86:00.0", "device_id": "10de:1bb3"}]  # Tesla P4
    assert nvidia_driver_gpu_support(gpus, "580", "proprietary") == []
    (warning,) = nvidia_driver_gpu_support(gpus, "590", "proprietary")
    assert "Pascal GPUs (10de:1bb3)" in warning and "580 is the last" in warning
    assert any("open kernel modules need Turing" in w for w in nvidia_driver_gpu_support(gpus, "580", "open"))
    blackwell = [{"pci_bus_id": "0000:07:00.0", "device_id": "10de:2901"}]
    assert len(nvidia_driver_gpu_support(blackwell, "550", "proprietary")) == 2
    assert nvidia_driver_gpu_support(blackwell, "580", "open") == []


@pytest.mark.parametrize(
    ("content", "enabled"),
    [("BgAAAAE=", True), ("BgAAAAA=", False), ("", False), ("not base64!", False), ("BgAA", False)],
)
def test_secure_boot_from_the_efi_variable(content, enabled):
    assert nvidia_secure_boot(content) is enabled


# --- MOK enrollment (MokListRT as shim hands it to the kernel) -------------------------------------------------------

# Built here from the UEFI specification's GUIDs (uuid's bytes_le is the stored, mixed-endian form), independently of
# the filter's own constant.
X509_TYPE = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072").bytes_le
SHA256_TYPE = uuid.UUID("c1c41626-504c-4092-aca9-41f936934328").bytes_le
OWNER = uuid.UUID("605dab50-e046-4300-abb6-3dd810dd8b23").bytes_le
# Stand-in DER certificates (a SEQUENCE header and filler): the filter compares bytes, it does not parse X.509.
DKMS_CERT = b"\x30\x82\x01\x0a" + bytes(range(256))[:0x10A]
OTHER_CERT = b"\x30\x82\x01\x0a" + bytes(reversed(range(256)))[:0x10A]


def signature_list(kind: bytes, *entries: bytes) -> bytes:
    size = 16 + len(entries[0])
    body = b"".join(OWNER + entry for entry in entries)
    return kind + struct.pack("<III", 28 + len(body), 0, size) + body


def efivar(*lists: bytes) -> str:
    # efivarfs puts the variable's 4 bytes of attributes (NV, BS, RT: 0x7) before its value.
    return base64.b64encode(struct.pack("<I", 7) + b"".join(lists)).decode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_mok_enrolled_finds_the_dkms_certificate_after_other_lists():
    moklist = efivar(signature_list(SHA256_TYPE, b"h" * 32, b"i" * 32), signature_list(X509_TYPE, OTHER_CERT),
                     signature_list(X509_TYPE, DKMS_CERT))  # fmt: skip
    assert nvidia_mok_enrolled(moklist, b64(DKMS_CERT)) is True


def test_mok_enrolled_reads_a_pem_certificate_too():
    pem = "-----BEGIN CERTIFICATE-----\n" + textwrap.fill(b64(DKMS_CERT), 64) + "\n-----END CERTIFICATE-----\n"
    assert nvidia_mok_enrolled(efivar(signature_list(X509_TYPE, DKMS_CERT)), b64(pem.encode())) is True


@pytest.mark.parametrize(
    "moklist",
    [
        efivar(signature_list(X509_TYPE, OTHER_CERT)),
        # The certificate's bytes as a hash entry's data are not an enrolled certificate.
        efivar(signature_list(SHA256_TYPE, DKMS_CERT[:32])),
        # A list whose size runs past the end of the variable is not read.
        efivar(signature_list(X509_TYPE, DKMS_CERT)[:-1]),
        efivar(),
        "",
        "not base64!",
    ],
    ids=["another key", "a hash list", "truncated", "empty list", "no variable", "garbage"],
)
def test_mok_not_enrolled(moklist):
    assert nvidia_mok_enrolled(moklist, b64(DKMS_CERT)) is False


def test_mok_enrolled_without_a_dkms_certificate_is_false():
    assert nvidia_mok_enrolled(efivar(signature_list(X509_TYPE, DKMS_CERT)), "") is False


def test_debian_source_has_the_driver_components_of_the_release_and_its_security_archive():
    text = nvidia_driver_apt_source("distribution", "bookworm")
    assert text.count("Types: deb\n") == 2
    assert "URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n" in text
    assert "URIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n" in text
    assert text.count("Components: contrib non-free non-free-firmware\n") == 2
    assert "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in text


def test_cuda_source_is_flat_and_signed_by_the_keyring_given():
    text = nvidia_driver_apt_source(
        "cuda", url="https://repo.example/debian12/x86_64/", keyring="/etc/apt/keyrings/k.asc"
    )
    assert text.splitlines()[1:] == [
        "Types: deb",
        "URIs: https://repo.example/debian12/x86_64/",
        "Suites: /",
        "Signed-By: /etc/apt/keyrings/k.asc",
    ]
    mirror = nvidia_driver_apt_source("mirror", url="http://mirror/", suite="stable", components=["main"])
    assert "Suites: stable\nComponents: main\nSigned-By: @KEYRING@\n" in mirror
    with pytest.raises(AnsibleFilterError, match="needs the repository's URL"):
        nvidia_driver_apt_source("mirror")

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
from ansible_collections.kubegpu.node.plugins.plugin_utils import _apt
from ansible_collections.kubegpu.node.plugins.plugin_utils import _nvidia_driver as nd

FIXTURES = Path(__file__).parent / "fixtures"
# /proc/driver/nvidia/version as the proprietary and the open modules write it.
PROC_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul 16 17:32:24 UTC 2025\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n"
)
PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)  Tue\n"
)


# --- versions --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("package", "upstream"),
    [("535.261.03-1~deb12u1", "535.261.03"), ("1:550.163.01-2", "550.163.01"), ("580.95.05", "580.95.05")],
)
def test_upstream_version_drops_epoch_and_revision(package, upstream):
    assert nd.upstream_version(package) == upstream


def test_branch_of_a_version():
    assert nd.driver_branch("535.261.03-1~deb12u1") == "535"
    assert nd.driver_branch("") == ""


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
    assert nd.loaded_version(text) == version


def test_branches_offered_newest_first():
    madison = ["550.163.01-2~bpo12+1", "535.261.03-1~deb12u1", "535.247.01-1~deb12u1", ""]
    assert nd.branches(madison) == ["550", "535"]
    assert nd.branches(["580.95.05-1", "590.44.01-1"]) == ["590", "580"]


def test_candidate_is_the_newest_of_the_branch_never_a_newer_branch():
    versions = ["580.82.07-1", "590.44.01-1", "580.95.05-1", "580.105.08-0ubuntu1"]
    assert nd.candidate(versions, 580) == "580.105.08-0ubuntu1"
    assert nd.candidate(versions, "580", "580.95.05") == "580.95.05-1"
    assert nd.candidate(versions, "580", "580.95.05-1") == "580.95.05-1"
    assert nd.candidate(versions, "570") == ""
    assert nd.candidate(versions, "580", "580.1.1") == ""


# --- kernels ---------------------------------------------------------------------------------------------------------


HEADERS = nd.Kernel(headers=True)


def test_kernels_default_to_the_next_boot_and_the_running_one_with_headers():
    boot = ["6.1.0-9-amd64", "6.1.0-28-amd64", "6.1.0-10-amd64"]
    found = {"6.1.0-10-amd64": HEADERS, "6.1.0-28-amd64": HEADERS}
    assert nd.choose_kernels(boot, "6.1.0-10-amd64", [], found) == nd.Kernels(
        targets=["6.1.0-10-amd64", "6.1.0-28-amd64"], next_boot="6.1.0-28-amd64"
    )


def test_kernels_running_is_newest():
    assert nd.choose_kernels(["6.1.0-28-amd64"], "6.1.0-28-amd64", [], {}).targets == ["6.1.0-28-amd64"]


def test_a_kernel_upgraded_and_not_rebooted_builds_for_the_next_boot_only():
    # unattended-upgrades installed 6.1.0-28 with its headers; the running 6.1.0-10 has none (and no module).
    kernels = nd.choose_kernels(["6.1.0-10-amd64", "6.1.0-28-amd64"], "6.1.0-10-amd64", [], {"6.1.0-28-amd64": HEADERS})
    assert kernels == nd.Kernels(targets=["6.1.0-28-amd64"], next_boot="6.1.0-28-amd64", skipped=["6.1.0-10-amd64"])
    # Precompiled modules need no headers: the running kernel gets its own.
    assert nd.choose_kernels(["6.1.0-28-amd64"], "6.1.0-10-amd64", [], {}, dkms=False).targets == [
        "6.1.0-10-amd64",
        "6.1.0-28-amd64",
    ]


def test_kernels_asked_for_win():
    result = nd.choose_kernels(["6.1.0-28-amd64"], "6.8.0-host", ["6.1.0-50-amd64", "6.1.0-9-amd64"], {})
    assert result == nd.Kernels(targets=["6.1.0-50-amd64", "6.1.0-9-amd64"], next_boot="6.1.0-50-amd64")


def test_no_kernel_at_all_is_a_refusal():
    with pytest.raises(nd.Refusal, match="no kernel"):
        nd.choose_kernels([], "", [], {})


# --- package naming --------------------------------------------------------------------------------------------------


def test_debian_proprietary_headless():
    result = nd.packages("535", "distribution", "Debian")
    assert result["packages"] == [
        "nvidia-kernel-dkms",
        "nvidia-smi",
        "libcuda1",
        "libnvidia-ml1",
        "firmware-nvidia-gsp",
        "nvidia-persistenced",
    ]
    assert result["kernel_package"] == "nvidia-kernel-dkms" and result["pinning"] == []
    assert "nvidia-driver" not in result["packages"]  # the metapackage pulls X11


def test_debian_open_without_persistenced_and_with_x():
    packages = nd.packages(550, "distribution", "Debian", "open", persistenced=False, headless=False)
    assert packages["packages"][0] == "nvidia-open-kernel-dkms"
    assert "nvidia-persistenced" not in packages["packages"] and "nvidia-driver" in packages["packages"]


def test_debian_before_gsp_firmware():
    assert "firmware-nvidia-gsp" not in nd.packages(470)["packages"]


def test_ubuntu_server_packages_and_precompiled_modules():
    result = nd.packages("570", "distribution", "Ubuntu", kernels=["6.8.0-45-generic"])
    assert result["packages"] == [
        "nvidia-headless-no-dkms-570-server",
        "nvidia-utils-570-server",
        "nvidia-dkms-570-server",
    ]
    assert result["precompiled"] == ["linux-modules-nvidia-570-server-6.8.0-45-generic"]
    open_ = nd.packages("570", "distribution", "Ubuntu", "open", kernels=["6.8.0-45-generic"])
    assert open_["precompiled"] == ["linux-modules-nvidia-570-server-open-6.8.0-45-generic"]
    assert open_["kernel_package"] == "nvidia-dkms-570-server-open"


@pytest.mark.parametrize("source", ["cuda", "mirror"])
def test_cuda_on_debian_is_the_compute_set_held_by_the_pinning_package(source):
    result = nd.packages("580", source, "Debian")
    assert result["pinning"] == ["nvidia-driver-pinning-580"]
    assert result["packages"] == ["nvidia-driver-cuda", "nvidia-kernel-dkms", "nvidia-persistenced"]
    assert result["kernel_package"] == "nvidia-kernel-dkms"
    full = nd.packages("580", source, "Debian", "open", headless=False)
    assert (
        full["packages"] == ["nvidia-open-580", "nvidia-persistenced"] and full["kernel_package"] == "nvidia-open-580"
    )
    assert nd.packages("580", source, headless=False)["packages"][0] == "cuda-drivers-580"
    assert nd.packages("590", source, headless=False)["packages"][0] == "cuda-drivers"


def test_cuda_on_ubuntu_names_the_branch_until_590():
    assert nd.packages("580", "cuda", "Ubuntu", "open")["packages"] == [
        "nvidia-headless-no-dkms-580-open",
        "nvidia-utils-580",
        "nvidia-dkms-580-open",
        "nvidia-persistenced",
    ]
    result = nd.packages("590", "cuda", "Ubuntu")
    assert result["packages"][:3] == ["nvidia-headless-no-dkms", "nvidia-utils", "nvidia-dkms"]
    assert result["pinning"] == ["nvidia-driver-pinning-590"]


def test_cuda_590_open_modules():
    result = nd.packages("590", "cuda", "Debian", "open")
    assert result["packages"] == ["nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced"]
    assert result["pinning"] == ["nvidia-driver-pinning-590"]


def test_cuda_before_pinning_packages():
    assert nd.packages("570", "cuda")["pinning"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("latest",), "branch is a number"),
        (("535", "nvidia"), "source must be one of"),
        (("535", "distribution", "Debian", "closed"), "flavour must be one of"),
        (("535", "distribution", "RedHat"), "use cuda or mirror"),
    ],
)
def test_package_naming_refuses_what_it_does_not_know(args, message):
    with pytest.raises(ValueError, match=message):
        nd.packages(*args)


# --- GPUs ------------------------------------------------------------------------------------------------------------


def test_smi_csv_with_header_and_nounits():
    gpus = nd.smi_gpus((FIXTURES / "nvidia_smi_query_gpu.csv").read_text())
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
    (gpu,) = nd.smi_gpus((FIXTURES / "nvidia_smi_query_gpu_units.csv").read_text())
    assert gpu["memory_total_mib"] == 15360 and gpu["name"] == "Tesla T4"


def test_smi_csv_without_compute_cap_from_an_old_driver():
    fields = ["index", "name", "uuid", "memory.total", "pci.bus_id"]
    (gpu,) = nd.smi_gpus("0, Tesla K80, GPU-abc, 11441, 00000000:04:00.0\n", fields)
    assert gpu["compute_capability"] is None and gpu["memory_total_mib"] == 11441


def test_smi_csv_no_gpu_is_empty():
    assert nd.smi_gpus("") == []


def test_smi_csv_with_a_short_line_is_an_error():
    with pytest.raises(ValueError, match="line 1 has 2 values, 6 expected"):
        nd.smi_gpus("0, Tesla T4\n")


# --- reboot decision -------------------------------------------------------------------------------------------------


def test_nothing_loaded_loads_without_reboot():
    result = nd.reboot_decision("535.261.03-1~deb12u1", "", False, True)
    assert (result.action, result.reboot_required, result.next_boot_ready) == ("load", False, True)


def test_nothing_loaded_and_no_gpu_skips_loading():
    result = nd.reboot_decision("535.261.03", "", False, False)
    assert result.action == "skip" and result.reboot_required is False


def test_same_version_loaded_needs_nothing():
    result = nd.reboot_decision("535.261.03", PROC_PROPRIETARY)
    assert result.as_dict() == {
        "action": "none",
        "reboot_required": False,
        "reason": "nvidia 535.261.03 is loaded and installed",
        "installed_version": "535.261.03",
        "loaded_version": "535.261.03",
        "next_boot_ready": True,
    }


@pytest.mark.parametrize("loaded", ["530.30.02\n", "550.163.01", "535.247.01"])
def test_another_version_loaded_needs_a_reboot(loaded):
    result = nd.reboot_decision("535.261.03", loaded)
    assert result.action == "reboot" and result.reboot_required is True
    assert "535.261.03 is installed" in result.reason


def test_nouveau_loaded_needs_a_reboot_even_with_nothing_else_loaded():
    result = nd.reboot_decision("535.261.03", "", nouveau_loaded=True)
    assert result.action == "reboot" and "nouveau" in result.reason


def test_nothing_built_for_the_next_boot_decides_nothing():
    result = nd.reboot_decision("", "535.261.03")
    assert (result.action, result.reboot_required, result.next_boot_ready) == ("none", False, False)


def test_a_kernel_upgraded_and_not_rebooted_needs_a_reboot_not_a_load():
    # Issue 17 item 6: the module is built for the next kernel only and nothing is loaded. Loading would run modprobe
    # for the running kernel, which has no module; the decision is a reboot.
    result = nd.reboot_decision(
        "580.95.05", "", False, True, running_module="", running_kernel="6.1.0-10-amd64", next_boot="6.1.0-28-amd64"
    )
    assert (result.action, result.reboot_required) == ("reboot", True)
    assert "6.1.0-10-amd64 has no nvidia module" in result.reason and "6.1.0-28-amd64" in result.reason
    # The running kernel has the module too: it is loaded now.
    assert nd.reboot_decision("580.95.05", "", running_module="580.95.05", next_boot="6.1.0-28-amd64").action == "load"
    # ... but an older one of an earlier install is not the installed driver.
    older = nd.reboot_decision("580.95.05", "", running_module="580.82.07", running_kernel="6.1.0-10-amd64")
    assert older.action == "reboot" and "has nvidia 580.82.07" in older.reason


def test_a_next_boot_whose_module_does_not_fit_the_packages_is_not_one_to_reboot_into():
    # A DKMS build failed halfway through a branch change: the packages are at 575, the next boot has no module.
    broken = nd.reboot_decision("", "580.95.05", packaged="575.64.05-1")
    assert (broken.action, broken.reboot_required, broken.next_boot_ready) == ("none", False, False)
    # The old module is still there, but the libraries are the new branch's: a reboot would break NVML.
    stale = nd.reboot_decision("580.95.05", "580.82.07", packaged="575.64.05-1")
    assert (stale.action, stale.reboot_required, stale.next_boot_ready) == ("none", False, False)
    assert "575.64.05" in stale.reason


# --- what a source offers, and what is installed from it ------------------------------------------------------------

# The role's probe of Debian 12 (bookworm and bookworm-security), as "package|version" lines.
BOOKWORM_PROBE = """ nvidia-kernel-dkms | 535.309.01-0+deb12u1 | http://deb.debian.org/debian-security bookworm-security
 nvidia-kernel-dkms | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages
 libcuda1 | 535.309.01-0+deb12u1 | http://deb.debian.org/debian-security bookworm-security/non-free amd64 Packages
 libcuda1 | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages
 nvidia-persistenced | 535.171.04-1~deb12u1 | http://deb.debian.org/debian bookworm/contrib amd64 Packages
"""


def test_pinned_versions_follow_the_exact_version_and_leave_others_alone():
    offered = _apt.parse_madison(BOOKWORM_PROBE.splitlines())
    packages = ["nvidia-kernel-dkms", "libcuda1", "nvidia-persistenced", "nvidia-cuda-mps"]
    assert nd.pinned(packages, offered, "535", "535.261.03") == [
        "nvidia-kernel-dkms=535.261.03-1",
        "libcuda1=535.261.03-1",
        "nvidia-persistenced=535.171.04-1~deb12u1",  # versioned apart: the newest of the branch
        "nvidia-cuda-mps",  # not offered by the probe: apt picks
    ]
    assert nd.pinned(packages[:1], offered, "535")[0] == "nvidia-kernel-dkms=535.309.01-0+deb12u1"


def test_a_newer_branch_in_the_same_source_is_never_pinned():
    offered = {"cuda-drivers-580": ["580.95.05-1"], "nvidia-driver-cuda": ["590.44.01-1", "580.95.05-1"]}
    assert nd.pinned(["nvidia-driver-cuda"], offered, "580") == ["nvidia-driver-cuda=580.95.05-1"]


def test_preferences_pin_the_branch_or_the_version():
    assert "Pin: version 535.*\n" in nd.preferences("535")
    text = nd.preferences("535", "535.261.03-1")
    assert "Pin: version 535.261.03*\n" in text and "Pin-Priority: 1001" in text
    assert "Package: /^(nvidia-|libnvidia-|libcuda|cuda-drivers" in text


# --- support warnings and Secure Boot --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "generation"),
    [("10de:1bb3", "Pascal"), ("10de:1db4", "Volta"), ("10de:1eb8", "Turing"), ("10de:20b2", "Ampere"),
     ("10de:2330", "Hopper"), ("10de:2901", "Blackwell"), ("10de:0fff", "")],
)  # fmt: skip
def test_gpu_generation(device_id, generation):
    assert nd.gpu_generation(device_id) == generation


def test_support_warnings_name_the_devices():
    gpus = [{"pci_bus_id": "0000:86:00.0", "device_id": "10de:1bb3"}]  # Tesla P4
    assert nd.gpu_support(gpus, "580", "proprietary") == []
    (warning,) = nd.gpu_support(gpus, "590", "proprietary")
    assert "Pascal GPUs (10de:1bb3)" in warning and "580 is the last" in warning
    assert any("open kernel modules need Turing" in w for w in nd.gpu_support(gpus, "580", "open"))
    blackwell = [{"pci_bus_id": "0000:07:00.0", "device_id": "10de:2901"}]
    assert len(nd.gpu_support(blackwell, "550", "proprietary")) == 2
    assert nd.gpu_support(blackwell, "580", "open") == []


@pytest.mark.parametrize(
    ("content", "enabled"),
    [("BgAAAAE=", True), ("BgAAAAA=", False), ("", False), ("not base64!", False), ("BgAA", False)],
)
def test_secure_boot_from_the_efi_variable(content, enabled):
    try:
        data = base64.b64decode(content, validate=True)
    except ValueError:
        data = b""
    assert nd.secure_boot_on(data) is enabled


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


def efivar(*lists: bytes) -> bytes:
    # efivarfs puts the variable's 4 bytes of attributes (NV, BS, RT: 0x7) before its value.
    return struct.pack("<I", 7) + b"".join(lists)


def b64(data: bytes) -> bytes:
    return data


def mok_enrolled(moklist: bytes | str, cert: bytes | str) -> bool:
    return nd.mok_enrolled(moklist or None, (cert.encode() if isinstance(cert, str) else cert) or None)


def test_mok_enrolled_finds_the_dkms_certificate_after_other_lists():
    moklist = efivar(signature_list(SHA256_TYPE, b"h" * 32, b"i" * 32), signature_list(X509_TYPE, OTHER_CERT),
                     signature_list(X509_TYPE, DKMS_CERT))  # fmt: skip
    assert mok_enrolled(moklist, b64(DKMS_CERT)) is True


def test_mok_enrolled_reads_a_pem_certificate_too():
    pem = (
        "-----BEGIN CERTIFICATE-----\n"
        + textwrap.fill(base64.b64encode(DKMS_CERT).decode(), 64)
        + "\n-----END CERTIFICATE-----\n"
    )
    assert mok_enrolled(efivar(signature_list(X509_TYPE, DKMS_CERT)), b64(pem.encode())) is True


@pytest.mark.parametrize(
    "moklist",
    [
        efivar(signature_list(X509_TYPE, OTHER_CERT)),
        # The certificate's bytes as a hash entry's data are not an enrolled certificate.
        efivar(signature_list(SHA256_TYPE, DKMS_CERT[:32])),
        # A list whose size runs past the end of the variable is not read.
        efivar(signature_list(X509_TYPE, DKMS_CERT)[:-1]),
        efivar(),
        b"",
    ],
    ids=["another key", "a hash list", "truncated", "empty list", "no variable"],
)
def test_mok_not_enrolled(moklist):
    assert mok_enrolled(moklist, b64(DKMS_CERT)) is False


def test_mok_enrolled_without_a_dkms_certificate_is_false():
    assert mok_enrolled(efivar(signature_list(X509_TYPE, DKMS_CERT)), "") is False


def test_debian_source_has_the_driver_components_of_the_release_and_its_security_archive():
    text = nd.apt_source("distribution", "bookworm")
    assert text.count("Types: deb\n") == 2
    assert "URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n" in text
    assert "URIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n" in text
    assert text.count("Components: contrib non-free non-free-firmware\n") == 2
    assert "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in text


def test_cuda_source_is_flat_and_signed_by_the_keyring_given():
    text = nd.apt_source("cuda", url="https://repo.example/debian12/x86_64/", keyring="/etc/apt/keyrings/k.asc")
    assert text.splitlines()[1:] == [
        "Types: deb",
        "URIs: https://repo.example/debian12/x86_64/",
        "Suites: /",
        "Signed-By: /etc/apt/keyrings/k.asc",
    ]
    mirror = nd.apt_source("mirror", url="http://mirror/", suite="stable", components=["main"])
    assert "Suites: stable\nComponents: main\nSigned-By: @KEYRING@\n" in mirror
    with pytest.raises(nd.Refusal, match="needs the repository's URL"):
        nd.apt_source("mirror")


# --- a foreign driver ------------------------------------------------------------------------------------------------


def test_a_run_installer_log_alone_is_a_trace_of_the_past():
    # Issue 17 item 6: after nvidia-uninstall only the installer's log is left; the role must not refuse forever.
    assert nd.foreign_driver(["/var/log/nvidia-installer.log"]) == ""
    assert "/var/log/nvidia-installer.log" not in nd.read_argv([], [], True)[7]
    message = nd.foreign_driver(["/usr/bin/nvidia-uninstall"])
    assert "nvidia-uninstall" in message and ".run installer" in message
    assert "GPU Operator manages the driver" in nd.foreign_driver(["/run/nvidia/driver"])


# --- the plan: one read of a node, the source's offer ----------------------------------------------------------------

NEXT = "6.1.0-28-amd64"
RUNNING = "6.1.0-10-amd64"
OFFER = {
    "nvidia-driver-pinning-580": ["580.95.05-1"],
    "nvidia-driver-pinning-590": ["590.44.01-1"],
    "nvidia-driver-cuda": ["590.44.01-1", "580.95.05-1", "580.82.07-1"],
    "nvidia-kernel-dkms": ["590.44.01-1", "580.95.05-1", "580.82.07-1"],
    "nvidia-persistenced": ["590.44.01-1", "580.95.05-1", "580.82.07-1"],
}
LATER = {name: ["580.105.08-1", *versions] for name, versions in OFFER.items() if name != "nvidia-driver-pinning-590"}
CUDA = nd.Inputs(branch="580", source="cuda", kernels=(NEXT,))
PCI_GPU = [{"pci_bus_id": "0000:07:00.0", "device_id": "10de:20b2", "class": "0x030200"}]
KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nxx\n-----END PGP PUBLIC KEY BLOCK-----\n"


def dpkg(version: str = "580.95.05-1", want: str = "hold", state: str = "installed", **others: str) -> str:
    names = ["nvidia-driver-pinning-580", "nvidia-driver-cuda", "nvidia-kernel-dkms", "nvidia-persistenced"]
    lines = [f"{name}|{version}|{want} ok {state}" for name in names]
    lines += [f"{name.replace('_', '-')}|{value}" for name, value in others.items()]
    return "\n".join(lines)


def node(
    module: str = "580.95.05",
    loaded: str = "",
    packages: str | None = None,
    running: str = NEXT,
    running_module: str | None = None,
    running_headers: bool = True,
) -> nd.NodeRead:
    kernels = {NEXT: nd.Kernel(headers=True, module=module)}
    if running != NEXT:
        kernels[running] = nd.Kernel(
            headers=running_headers, module=module if running_module is None else running_module
        )
    read = nd.NodeRead(
        running=running,
        boot=[NEXT],
        kernels=kernels,
        dpkg=_apt.parse_dpkg_query(dpkg() if packages is None else packages),
        loaded=loaded,
        persistenced_enabled=True,
    )
    return read


def converged_files(inputs: nd.Inputs = CUDA, facts: str | None = None) -> dict[str, str | None]:
    files: dict[str, str | None] = {
        nd.KEYRING_FILE: KEY,
        nd.SOURCE_FILE: inputs.source_text(nd.KEYRING_FILE),
        nd.PREFERENCES_FILE: nd.preferences(inputs.branch, inputs.version),
        nd.BLACKLIST_FILE: nd.BLACKLIST,
        nd.FACT_FILE: facts,
    }
    return files


def plan(inputs=CUDA, read=None, offer=None, files=None, gpus=(), **kwargs) -> dict:
    read = read or node()
    files = converged_files(inputs) if files is None else files
    source = nd.Source(key=KEY, offered=OFFER if offer is None else offer)
    return nd.plan(inputs, read, source, files, list(gpus), **kwargs).result


def test_a_node_in_place_needs_nothing_and_a_second_plan_says_so():
    first = plan()
    changes = first["changes"]
    assert changes["install_pinning"] == changes["install_packages"] == changes["to_hold"] == []
    assert changes["remove"] == changes["dkms_build"] == [] and not changes["update_lists"]
    assert [f["path"] for f in first["files"] if f["changed"]] == []
    assert first["facts_changed"]  # no facts file yet
    again = plan(files=converged_files(facts=first["facts_text"]))
    assert not again["facts_changed"]
    assert again["facts"]["installed_version"] == "580.95.05" and again["facts"]["next_boot_ready"] is True


def test_the_steps_of_a_node_in_place_are_none_and_each_change_turns_its_step_on():
    # tasks/main.yml includes install.yml, activate.yml and facts.yml only for their step: a step left off that had
    # work would leave the node unchanged without a word, so each kind of work must turn its step on.
    in_place = plan()
    assert in_place["steps"] == {"install": False, "activate": False, "facts": True}  # no facts file yet
    assert plan(files=converged_files(facts=in_place["facts_text"]))["steps"] == dict.fromkeys(
        ("install", "activate", "facts"), False
    )
    assert plan(offer=LATER)["steps"]["install"]  # a new point release: lists, pinning, packages
    assert plan(nd.Inputs(branch="590", source="cuda", kernels=(NEXT,)))["steps"]["install"]  # a branch change
    unheld = node(packages=dpkg(want="install"))
    assert plan(read=unheld)["steps"]["install"]  # only the holds
    files = converged_files()
    files[nd.BLACKLIST_FILE] = None
    assert plan(files=files)["steps"]["install"]  # only a file
    assert plan(read=node(module=""))["changes"]["dkms_build"] and plan(read=node(module=""))["steps"]["install"]
    loads = plan(read=node(running=RUNNING), gpus=PCI_GPU, inputs=nd.Inputs(branch="580", source="cuda"))
    assert loads["steps"]["activate"]  # a load and nvidia-persistenced
    reboots = plan(
        nd.Inputs(branch="580", source="cuda"),
        read=node(running=RUNNING, running_module="", running_headers=False),
        gpus=PCI_GPU,
    )
    assert reboots["decision"]["reboot_required"] and reboots["steps"]["activate"]
    stopped = node()
    stopped.persistenced_enabled = False
    assert plan(read=stopped)["steps"] == {"install": False, "activate": True, "facts": True}


def test_a_new_point_release_is_installed_from_lists_updated_first():
    # Issue 17 item 6: NVIDIA published 580.105.08 since the last run. The plan takes it from the source; apt installs
    # from the node's own lists, so they are updated (the role's source only) before apt runs.
    result = plan(offer=LATER)
    assert result["changes"]["install_packages"] == [
        "nvidia-driver-cuda=580.105.08-1",
        "nvidia-kernel-dkms=580.105.08-1",
        "nvidia-persistenced=580.105.08-1",
    ]
    assert result["changes"]["install_pinning"] == ["nvidia-driver-pinning-580=580.105.08-1"]
    assert result["changes"]["update_lists"] is True
    assert result["update_lists_argv"] == _apt.update_lists_argv(nd.SOURCE_FILE)
    # Nothing to install, nothing to update: a no-op run reads no list.
    assert plan()["changes"]["update_lists"] is False


def test_a_source_the_node_does_not_write_is_read_from_its_own_lists_and_never_updated():
    unmanaged = nd.Inputs(branch="580", source="cuda", kernels=(NEXT,), manage_repository=False)
    assert plan(unmanaged, offer=LATER)["changes"]["update_lists"] is False
    assert unmanaged.source_text() == ""


def test_a_branch_change_removes_the_other_branchs_pinning_package():
    # Issue 17 item 6: after 580 -> 590 the 580 pinning package stayed with its pin, outside the facts' packages.
    branch_590 = nd.Inputs(branch="590", source="cuda", kernels=(NEXT,))
    result = plan(branch_590, files=converged_files())
    assert result["changes"]["remove"] == ["nvidia-driver-pinning-580"]
    assert result["changes"]["install_pinning"] == ["nvidia-driver-pinning-590=590.44.01-1"]
    assert "nvidia-driver-pinning-590" in result["facts"]["packages"]
    assert "nvidia-driver-pinning-580" not in result["facts"]["packages"]
    # And state absent removes every pinning package, recorded or not.
    read = node(packages=dpkg() + "\nnvidia-driver-pinning-590|590.44.01-1|hold ok installed")
    facts = '{"packages": ["nvidia-driver-cuda", "nvidia-kernel-dkms"]}'
    absent = nd.absent_plan(read, {nd.FACT_FILE: facts, nd.SOURCE_FILE: "x"})
    assert absent["remove"] == [
        "nvidia-driver-cuda",
        "nvidia-kernel-dkms",
        "nvidia-driver-pinning-580",
        "nvidia-driver-pinning-590",
    ]
    assert absent["files"] == [nd.SOURCE_FILE, nd.FACT_FILE] and absent["source_removed"]


def test_a_kernel_upgraded_and_not_rebooted_is_a_reboot_and_builds_for_the_next_boot():
    # The running kernel has neither headers nor module; the next boot's module is built; a GPU, nothing loaded.
    inputs = nd.Inputs(branch="580", source="cuda")
    read = node(running=RUNNING, running_module="", running_headers=False)
    result = nd.plan(inputs, read, nd.Source(KEY, OFFER), converged_files(inputs), PCI_GPU)
    assert result.result["kernels"]["targets"] == [NEXT]
    assert result.result["decision"]["action"] == "reboot" and result.result["decision"]["reboot_required"]
    assert result.result["facts"]["reboot_required"] is True
    assert any("has no headers" in warning for warning in result.warnings)
    # With no GPU there is nothing to load or reboot for.
    assert plan(inputs, read)["decision"]["action"] == "skip"


def test_a_running_kernel_with_the_module_and_a_gpu_loads_it():
    result = plan(read=node(running=RUNNING), gpus=PCI_GPU, inputs=nd.Inputs(branch="580", source="cuda"))
    assert result["decision"]["action"] == "load"
    assert result["persistenced"] == {"enable": False, "start": True, "change": True}


def test_a_target_kernel_without_the_module_is_built_for():
    result = plan(read=node(module=""))
    assert result["changes"]["dkms_build"] == [NEXT]
    assert result["decision"]["next_boot_ready"] is False


def test_headers_missing_for_a_kernel_asked_for_is_refused():
    with pytest.raises(nd.Refusal, match=r"DKMS cannot build the nvidia module for 6\.1\.0-99-amd64.*Nothing was"):
        plan(nd.Inputs(branch="580", source="cuda", kernels=("6.1.0-99-amd64",)))


def test_a_branch_the_source_lacks_is_refused_with_the_branches_it_has():
    with pytest.raises(nd.Refusal, match=r"no nvidia-kernel-dkms in branch 550.*Branches it has: 590, 580"):
        plan(nd.Inputs(branch="550", source="cuda", kernels=(NEXT,)))


def test_check_mode_decides_for_the_version_the_packages_would_install():
    # 580.82.07 loaded and installed; the plan installs 580.95.05: check mode says a reboot will be needed.
    read = node(module="580.82.07", loaded="580.82.07", packages=dpkg("580.82.07-1"))
    real = plan(read=read)
    assert real["decision"]["action"] == "none"
    check = plan(read=read, check_mode=True)
    assert check["decision"]["action"] == "reboot" and check["decision"]["installed_version"] == "580.95.05"


def test_after_a_failure_the_plan_records_the_node_and_holds_again():
    # Issue 17 item 6: apt failed in the DKMS postinst of a branch change (580 -> 575): the packages are at 575,
    # unpacked or half-configured and released from their holds; the next boot has no module.
    packages = "\n".join(
        [
            "nvidia-driver-cuda|575.64.05-1|install ok unpacked",
            "nvidia-kernel-dkms|575.64.05-1|install ok half-configured",
            "nvidia-persistenced|575.64.05-1|install ok installed",
        ]
    )
    inputs = nd.Inputs(branch="575", source="cuda", kernels=(NEXT,))
    offer = {**OFFER, **{name: ["575.64.05-1"] for name in ("nvidia-driver-cuda", "nvidia-kernel-dkms")}}
    offer["nvidia-persistenced"] = ["575.64.05-1"]
    read = node(module="", loaded="580.95.05", packages=packages)
    result = plan(inputs, read, offer=offer, files=converged_files(inputs), error="apt: dkms failed")
    assert result["changes"]["to_hold"] == ["nvidia-driver-cuda", "nvidia-kernel-dkms", "nvidia-persistenced"]
    facts = result["facts"]
    assert facts["error"] == "apt: dkms failed"
    assert facts["reboot_required"] is False and facts["next_boot_ready"] is False
    assert facts["installed_version"] == "" and facts["loaded_version"] == "580.95.05"
    assert facts["installed_packages"]["nvidia-kernel-dkms"] == "575.64.05-1"
    assert result["decision"]["action"] == "none" and not result["persistenced"]["change"]


def test_precompiled_modules_when_ubuntu_has_them_for_every_kernel():
    ubuntu = nd.Inputs(branch="570", distribution="Ubuntu", distribution_version="24.04", distribution_major="24",
                       codename="noble", kernels=("6.8.0-45-generic",))  # fmt: skip
    read = nd.NodeRead(running="6.8.0-45-generic", boot=["6.8.0-45-generic"], kernels={"6.8.0-45-generic": nd.Kernel()})
    offer = {
        "nvidia-headless-no-dkms-570-server": ["570.195.03-0ubuntu0.24.04.1"],
        "nvidia-utils-570-server": ["570.195.03-0ubuntu0.24.04.1"],
        "nvidia-dkms-570-server": ["570.195.03-0ubuntu0.24.04.1"],
        "linux-modules-nvidia-570-server-6.8.0-45-generic": ["6.8.0-45.45+1"],
    }
    result = plan(ubuntu, read, offer=offer, files={})
    assert result["dkms"] is False
    # Versioned with the kernel, not the driver: apt picks its version (the -server packages pin the driver's).
    assert "linux-modules-nvidia-570-server-6.8.0-45-generic" in result["planned"]
    assert not any(p.startswith("nvidia-dkms-") for p in result["planned"])
    # Without them for every kernel: DKMS, which needs the headers.
    with pytest.raises(nd.Refusal, match="headers are missing"):
        plan(ubuntu, read, offer={k: v for k, v in offer.items() if not k.startswith("linux-modules")}, files={})
    # Ubuntu's own archive already has the packages: no source, no key written.
    assert [f["path"] for f in result["files"]] == [nd.PREFERENCES_FILE, nd.BLACKLIST_FILE]


# --- inputs and the key ----------------------------------------------------------------------------------------------


def test_source_cuda_fetches_nvidias_key_for_the_system():
    assert CUDA.key_url == "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/3bf863cc.pub"
    trixie = nd.Inputs(branch="580", source="cuda", distribution_version="13", distribution_major="13")
    assert trixie.key_url.endswith("/debian13/x86_64/8793F200.pub")
    assert nd.Inputs(branch="580", source="cuda", repository_key=KEY).key_url == ""
    assert nd.Inputs(source="distribution").key_url == ""


def test_a_key_url_without_fingerprints_is_refused():
    with pytest.raises(nd.Refusal, match="trusted only by its fingerprint"):
        nd.check_inputs(nd.Inputs(branch="580", source="cuda", repository_key_fingerprints=()))
    nd.check_inputs(nd.Inputs(branch="580", source="mirror", repository_url="http://m/", repository_key=KEY,
                              repository_key_fingerprints=()))  # fmt: skip
    with pytest.raises(nd.Refusal, match="needs the repository's signing key"):
        nd.check_inputs(nd.Inputs(branch="580", source="mirror", repository_url="http://m/"))


@pytest.mark.skipif(not shutil.which("gpg"), reason="needs gpg to make a key")
def test_the_key_must_have_a_trusted_fingerprint(tmp_path):
    home = tmp_path / "g"
    home.mkdir(mode=0o700)
    base = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    subprocess.run([*base, "--quick-generate-key", "k <k@test.invalid>", "ed25519", "sign", "never"], check=True,
                   capture_output=True)  # fmt: skip
    key = subprocess.run([*base, "--armor", "--export"], check=True, capture_output=True, text=True).stdout
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], check=False)
    (fingerprint,) = _apt.openpgp_fingerprints(key)
    inputs = nd.Inputs(branch="580", source="cuda")
    with pytest.raises(nd.Refusal, match=f"has the fingerprint\\(s\\) {fingerprint}, and only EB693B30"):
        nd.check_key(inputs, key, "")
    nd.check_key(nd.Inputs(branch="580", source="cuda", repository_key_fingerprints=(fingerprint.lower(),)), key, "")
    inline = nd.Inputs(branch="580", source="mirror", repository_url="http://m/", repository_key=key)
    with pytest.raises(nd.Refusal, match="has the fingerprint"):
        nd.check_key(inline, key, "")  # NVIDIA's fingerprints by default: an inline key of another owner is refused
    nd.check_key(nd.Inputs(branch="580", source="mirror", repository_url="http://m/", repository_key=key,
                           repository_key_fingerprints=()), key, "")  # fmt: skip
    with pytest.raises(nd.Refusal, match="could not fetch the repository's signing key"):
        nd.check_key(inputs, None, "404  Not Found")


# --- the node read ---------------------------------------------------------------------------------------------------


def test_parse_a_full_read():
    out = "\n".join(
        [
            "@@running",
            RUNNING,
            "@@boot",
            RUNNING,
            NEXT,
            "@@modules",
            f"{RUNNING} no ",
            f"{NEXT} yes 580.95.05",
            "@@dpkg",
            "nvidia-kernel-dkms|580.95.05-1|hold ok installed",
            "@@loaded",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07  Wed Jul 16 17:32:24 UTC 2025",
            "@@nouveau",
            "@@persistenced",
            "disabled",
            "inactive",
            "@@smi 0 index,name,uuid,memory.total,pci.bus_id",
            "0, Tesla T4, GPU-1, 15360, 00000000:07:00.0",
            f"@@file {nd.BLACKLIST_FILE}",
            base64.b64encode(nd.BLACKLIST.encode()).decode(),
            f"@@nofile {nd.FACT_FILE}",
            "@@foreign",
            "@@initramfs 6.1.0-28-amd64 1",
            "@@secureboot",
            base64.b64encode(b"\x06\x00\x00\x00\x01").decode(),
            "@@mok",
            "@@moklist",
            "@@df",
            "Filesystem     1048576-blocks  Used Available Capacity Mounted on",
            "/dev/vda1               258020 32361     1200      32% /",
            "/dev/vda2               258020 32361     7000      32% /var",
        ]
    )
    read = nd.parse_read(out)
    assert read.kernels == {RUNNING: nd.Kernel(False, ""), NEXT: nd.Kernel(True, "580.95.05")}
    assert read.loaded == "580.82.07" and not read.nouveau and not read.persistenced_enabled
    assert read.smi_answers and nd.smi_gpus(read.smi_text, read.smi_fields)[0]["name"] == "Tesla T4"
    assert read.files == {nd.BLACKLIST_FILE: nd.BLACKLIST, nd.FACT_FILE: None}
    assert read.initramfs_kernel == NEXT and read.initramfs_has_blacklist is True
    assert nd.secure_boot_on(read.secure_boot) and read.mok is None
    assert read.free_mib == {"/": 1200, "/var": 7000}
    with pytest.raises(nd.Refusal, match="1200 MiB are free"):
        nd.refuse_node(nd.Inputs(branch="580"), read)
    with pytest.raises(nd.Refusal, match="DKMS has no signing key"):
        nd.refuse_secure_boot(read, dkms=True)
    nd.refuse_secure_boot(read, dkms=False)  # precompiled modules are signed


@pytest.mark.skipif(not shutil.which("dpkg-query"), reason="needs a Debian-family machine")
def test_the_read_runs_under_a_posix_shell_and_parses():
    """The read script itself, on this machine (no driver here): every section is there and parses."""
    said = subprocess.run(
        nd.read_argv(["6.1.0-99-amd64"], ["dpkg", "nvidia-*"], full=True), capture_output=True, text=True, check=False
    )
    assert said.returncode == 0, said.stderr
    read = nd.parse_read(said.stdout)
    assert read.running and read.running in read.kernels
    assert read.kernels["6.1.0-99-amd64"] == nd.Kernel(headers=False, module="")
    assert read.dpkg["dpkg"].installed
    assert read.full and set(read.files) == set(nd.OWN_FILES)
    assert read.free_mib


def test_a_node_left_broken_by_a_failed_postinst_is_repaired_in_one_transaction():
    packages = "\n".join(
        [
            "nvidia-driver-cuda|575.64.05-1|hold ok unpacked",
            "nvidia-kernel-dkms|575.64.05-1|hold ok half-configured",
            "nvidia-persistenced|575.64.05-1|hold ok installed",
        ]
    )
    result = plan(read=node(module="", packages=packages))
    changes = result["changes"]
    assert changes["broken"] == ["nvidia-driver-cuda", "nvidia-kernel-dkms"] and changes["apt_state"] == "fixed"
    assert changes["install_pinning"] == []
    assert changes["install_packages"] == [
        "nvidia-driver-pinning-580=580.95.05-1",
        "nvidia-driver-cuda=580.95.05-1",
        "nvidia-kernel-dkms=580.95.05-1",
        "nvidia-persistenced=580.95.05-1",
    ]
    assert plan()["changes"]["apt_state"] == "present"


@pytest.mark.parametrize(
    ("distribution", "architecture"),
    [("Debian", "x86_64"), ("Ubuntu", "aarch64")],
)
def test_debian_and_ubuntu_on_x86_64_and_aarch64_are_platforms_of_the_role(distribution, architecture):
    nd.check_platform(nd.Inputs(branch="580", distribution=distribution, architecture=architecture))


@pytest.mark.parametrize(
    ("distribution", "version", "architecture"),
    [("Rocky", "9.4", "x86_64"), ("Linuxmint", "22", "x86_64"), ("Debian", "12", "ppc64le")],
)
def test_another_system_or_architecture_is_refused_before_the_node_is_read(distribution, version, architecture):
    inputs = nd.Inputs(branch="580", distribution=distribution, distribution_version=version, architecture=architecture)
    with pytest.raises(nd.Refusal) as refused:
        nd.check_platform(inputs)
    assert str(refused.value) == (
        "kubegpu.node.nvidia_driver installs the driver from apt packages on Debian and Ubuntu, on x86_64 or aarch64; "
        f"it runs {distribution} {version} on {architecture}. Install the driver there with the system's own tools. "
        "Nothing was changed."
    )

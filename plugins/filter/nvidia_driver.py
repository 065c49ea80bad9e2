# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# The filters of the role kubegpu.node.nvidia_driver. Documentation: one .yml per filter next to this file. Pure: the
# role reads the node (nvidia-smi, sysfs, modinfo, apt-cache, dpkg-query), these parse and decide.

from __future__ import annotations

import base64
import csv
import re
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.kubegpu.node.plugins.filter.nvidia_container_toolkit import parse_dpkg_query

SOURCES = ("distribution", "cuda", "mirror")
FLAVOURS = ("proprietary", "open")
# The fields the role asks nvidia-smi for, in this order (`--query-gpu=...`); compute_cap is unknown to drivers older
# than 510, which refuse the whole query, so the role asks again without it.
SMI_FIELDS = ("index", "name", "uuid", "memory.total", "pci.bus_id", "compute_cap")
SMI_MISSING = ("[N/A]", "[Not Supported]", "N/A", "")
# PCI classes of an NVIDIA GPU: VGA controller (0x0300xx) and 3D controller (0x0302xx, the data-centre boards).
PCI_GPU_CLASSES = ("0x0300", "0x0302")
NVIDIA_PCI_VENDOR = "0x10de"
# NVIDIA's CUDA repository names drivers without the branch from 590 on; from 580 a pinning package per branch holds
# a branch (installed before the driver). Firmware for the GSP is packaged separately by Debian from 525.
CUDA_UNVERSIONED_FROM = 590
CUDA_PINNING_FROM = 580
DEBIAN_GSP_FIRMWARE_FROM = 525

# The driver's packages in Debian, Ubuntu and NVIDIA's repository (all built from the driver and versioned with it).
DRIVER_PACKAGES_PATTERN = (
    "/^(nvidia-|libnvidia-|libcuda|cuda-drivers|firmware-nvidia|xserver-xorg-video-nvidia|libxnvctrl)/"
)
# The PCI device ids of NVIDIA GPU generations, by their first two hex digits (a coarse map: it only feeds warnings).
GPU_GENERATIONS = {
    "13": "Maxwell", "14": "Maxwell", "17": "Maxwell",
    "15": "Pascal", "1b": "Pascal", "1c": "Pascal",
    "1e": "Turing", "1f": "Turing", "21": "Turing",
    "20": "Ampere", "22": "Ampere", "24": "Ampere", "25": "Ampere",
    "23": "Hopper",
    "26": "Ada", "27": "Ada", "28": "Ada",
    "29": "Blackwell", "2b": "Blackwell", "2c": "Blackwell", "2d": "Blackwell", "2f": "Blackwell",
}  # fmt: skip
GENERATIONS_BEFORE_TURING = ("Maxwell", "Pascal", "Volta")
# 580 is the last branch for Maxwell, Pascal and Volta; Blackwell needs 570 or later and the open modules.
LAST_BRANCH_BEFORE_TURING = 580
FIRST_BRANCH_FOR_BLACKWELL = 570

_VERSION_PART = re.compile(r"(\d+)|([^\d]+)")


# ---------------------------------------------------------------------------------------------------------------------
# Versions
# ---------------------------------------------------------------------------------------------------------------------


def upstream_version(package_version: str) -> str:
    """NVIDIA's version inside a Debian package version: '1:535.261.03-1~deb12u1' -> '535.261.03'."""
    version = str(package_version).strip()
    if ":" in version:
        version = version.split(":", 1)[1]
    if "-" in version:
        version = version.rsplit("-", 1)[0]
    return version


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders '535.54.03' < '535.261.03' and '6.1.0-9-amd64' < '6.1.0-28-amd64' (numbers as numbers)."""
    parts: list[tuple[int, int | str]] = []
    for number, text in _VERSION_PART.findall(str(version)):
        parts.append((1, int(number)) if number else (0, text))
    return tuple(parts)


def compare_versions(left: str, right: str) -> int:
    """-1, 0 or 1 as the driver version `left` is older than, the same as or newer than `right`."""
    a, b = version_key(left), version_key(right)
    return (a > b) - (a < b)


def driver_branch(version: str | None) -> str:
    """The branch of a driver version: '535.261.03' -> '535'; '' when there is no version."""
    if not version:
        return ""
    match = re.match(r"\s*(\d+)", upstream_version(version))
    return match.group(1) if match else ""


def version_in_branch(version: str, branch: str | int, exact: str | None = None) -> bool:
    """Whether an (upstream or package) version belongs to the branch, and equals `exact` when one is asked for."""
    upstream = upstream_version(version)
    if driver_branch(upstream) != str(branch):
        return False
    if exact:
        return upstream == upstream_version(exact) or str(version) == str(exact)
    return True


def loaded_version(text: str | None) -> str:
    """The version of the loaded nvidia module, from /sys/module/nvidia/version ('535.261.03') or
    /proc/driver/nvidia/version ('NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed ...'); '' when none.
    """
    if not text:
        return ""
    text = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)+", text):
        return text
    match = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else ""


def nvidia_driver_branches(package_versions: list[str] | str) -> list[str]:
    """The branches offered by a source, from the package versions it lists (apt-cache madison's second column, or
    one version per line), newest first."""
    if isinstance(package_versions, str):
        package_versions = package_versions.splitlines()
    branches = {driver_branch(v) for v in package_versions if driver_branch(v)}
    return sorted(branches, key=int, reverse=True)


def nvidia_driver_candidate(package_versions: list[str] | str, branch: str | int, exact: str | None = None) -> str:
    """The newest package version in the branch (the exact one when asked for), '' when the source has none."""
    if isinstance(package_versions, str):
        package_versions = package_versions.splitlines()
    matching = [v.strip() for v in package_versions if v.strip() and version_in_branch(v.strip(), branch, exact)]
    if not matching:
        return ""
    return max(matching, key=lambda v: version_key(upstream_version(v)))


def nvidia_driver_madison(text: str) -> dict[str, list[str]]:
    """'package|version' lines (the role's probe of a source, from apt-cache madison) as {package: [versions]}."""
    offered: dict[str, list[str]] = {}
    for line in str(text or "").splitlines():
        package, sep, version = line.strip().partition("|")
        if sep and package and version:
            versions = offered.setdefault(package, [])
            if version not in versions:
                versions.append(version)
    return offered


def nvidia_driver_pinned(
    packages: list[str], offered: dict[str, list[str]], branch: str | int, exact: str | None = None
) -> list[str]:
    """Each package as apt installs it: 'name=version' at the branch's (or the exact) version where the source offers
    one in the branch, the bare name otherwise (packages versioned apart from the driver, such as nvidia-persistenced
    on Debian, or extra packages)."""
    pinned: list[str] = []
    for name in dict.fromkeys(packages):
        versions = offered.get(name, [])
        candidate = nvidia_driver_candidate(versions, branch, exact) or nvidia_driver_candidate(versions, branch)
        pinned.append(f"{name}={candidate}" if candidate else name)
    return pinned


def nvidia_driver_install_plan(dpkg_query: str, planned: list[str]) -> dict[str, list[str]]:
    """What apt and dpkg must still do for the planned packages ('name=version', or a bare name that apt picks the
    version of), from `dpkg-query -W -f='${Package}|${Version}|${Status}\\n' NAMES...`.

    install: the planned entries apt must install: not installed (dpkg's current state is not "installed": unknown,
    config-files, half-installed, unpacked...), or installed at another version. The rule is the apt module's own
    (current state installed, the installed version matching the one asked for; Debian versions hold no fnmatch
    wildcards, so matching is equality, epoch included), so skipping apt when this is empty skips nothing that apt
    would have done. A name dpkg-query does not list (a virtual package, an architecture-qualified
    name) is always to install: apt decides, as before.
    to_hold: the planned names that dpkg does not hold yet.
    """
    if not isinstance(planned, list | tuple):
        raise AnsibleFilterError("nvidia_driver_install_plan expects the list of packages to install ('name=version')")
    current = parse_dpkg_query(str(dpkg_query or ""))
    install: list[str] = []
    to_hold: list[str] = []
    for entry in dict.fromkeys(str(item) for item in planned):
        name, pinned, version = entry.partition("=")
        info = current.get(name, {})
        if info.get("state") != "installed" or (pinned and info.get("version") != version):
            install.append(entry)
        if info.get("want") != "hold":
            to_hold.append(name)
    return {"install": install, "to_hold": to_hold}


def nvidia_driver_apt_source(
    source: str,
    codename: str = "",
    debian_mirror: str = "http://deb.debian.org/debian",
    security_mirror: str = "http://deb.debian.org/debian-security",
    url: str = "",
    suite: str = "/",
    components: list[str] | None = None,
    keyring: str = "@KEYRING@",
) -> str:
    """The deb822 package source: Debian's components that hold the driver (release, updates and security), or the
    repository of sources cuda and mirror signed by `keyring` (a flat repository has suite '/' and no components)."""
    _check_choice("source", source, SOURCES)
    if source == "distribution":
        stanzas = [
            (debian_mirror, f"{codename} {codename}-updates"),
            (security_mirror, f"{codename}-security"),
        ]
        return (
            "# Written by kubegpu.node.nvidia_driver: the components Debian ships the NVIDIA driver in.\n"
            + "\n".join(
                f"Types: deb\nURIs: {uri}\nSuites: {suites}\nComponents: contrib non-free non-free-firmware\n"
                "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
                for uri, suites in stanzas
            )
        )
    if not url:
        raise AnsibleFilterError(f"nvidia_driver_apt_source: source {source} needs the repository's URL")
    lines = [
        f"# Written by kubegpu.node.nvidia_driver: NVIDIA's driver packages ({source}).",
        "Types: deb",
        f"URIs: {url}",
        f"Suites: {suite}",
    ]
    if components:
        lines.append(f"Components: {' '.join(components)}")
    lines.append(f"Signed-By: {keyring}")
    return "\n".join(lines) + "\n"


def nvidia_driver_preferences(branch: str | int, exact: str | None = None) -> str:
    """An apt preferences file that keeps every driver package at the branch (or the exact version): without it apt
    resolves the driver's exact-version dependencies (nvidia-alternative, libnvidia-*) to the newest version and
    refuses, or pulls a newer branch in. Packages versioned apart from the driver do not match and keep their
    priority."""
    version = f"{upstream_version(exact)}*" if exact else f"{branch}.*"
    return (
        "# Written by kubegpu.node.nvidia_driver: apt keeps the NVIDIA driver at this version, whatever newer the\n"
        "# sources offer.\n"
        f"Package: {DRIVER_PACKAGES_PATTERN}\n"
        f"Pin: version {version}\n"
        "Pin-Priority: 1001\n"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------------


def nvidia_driver_kernels(installed: list[str], running: str = "", wanted: list[str] | None = None) -> dict[str, Any]:
    """The kernels to build the module for and the one that boots next.

    `installed` lists the kernels with an image (/boot/vmlinuz-*); `wanted` the user's list (empty: the running
    kernel and the newest installed one). The next boot is the newest kernel of the list.
    """
    installed = [k for k in (installed or []) if k]
    if wanted:
        kernels = list(dict.fromkeys(wanted))
    else:
        newest = max(installed, key=version_key) if installed else ""
        kernels = list(dict.fromkeys(k for k in (running, newest) if k))
    if not kernels:
        raise AnsibleFilterError("nvidia_driver_kernels: no kernel to build for (none running, none installed)")
    return {"kernels": kernels, "next_boot": max(kernels, key=version_key)}


# ---------------------------------------------------------------------------------------------------------------------
# Packages per source and distribution
# ---------------------------------------------------------------------------------------------------------------------


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise AnsibleFilterError(f"nvidia_driver_packages: {what} must be one of {', '.join(choices)}, not {value!r}")


def nvidia_driver_packages(
    branch: str | int,
    source: str = "distribution",
    distribution: str = "Debian",
    flavour: str = "proprietary",
    persistenced: bool = True,
    headless: bool = True,
    kernels: list[str] | None = None,
) -> dict[str, Any]:
    """The packages of a driver branch: {packages, pinning, dkms, precompiled, kernel_package, check_package}.

    packages      what apt installs (and the role holds), kernel module package included
    pinning       NVIDIA's pinning packages, installed first (cuda/mirror from 580)
    dkms          whether the kernel module is built by DKMS
    precompiled   Ubuntu's signed precompiled module packages per kernel (used instead of DKMS when all exist)
    kernel_package the package whose versions say which branches the source offers
    """
    _check_choice("source", source, SOURCES)
    _check_choice("flavour", flavour, FLAVOURS)
    if not re.fullmatch(r"\d{3,}", str(branch)):
        raise AnsibleFilterError(f"nvidia_driver_packages: the branch is a number such as 535 or 580, not {branch!r}")
    number = int(branch)
    open_ = flavour == "open"
    result: dict[str, Any] = {"packages": [], "pinning": [], "dkms": True, "precompiled": [], "kernel_package": ""}

    if source == "distribution" and distribution == "Debian":
        kernel = "nvidia-open-kernel-dkms" if open_ else "nvidia-kernel-dkms"
        packages = [kernel, "nvidia-smi", "libcuda1", "libnvidia-ml1"]
        if number >= DEBIAN_GSP_FIRMWARE_FROM:
            packages.append("firmware-nvidia-gsp")
        if not headless:
            packages.append("nvidia-driver")
        result.update(kernel_package=kernel)
    elif source == "distribution" and distribution == "Ubuntu":
        suffix = f"{number}-server" + ("-open" if open_ else "")
        kernel = f"nvidia-dkms-{suffix}"
        packages = [f"nvidia-headless-no-dkms-{suffix}", f"nvidia-utils-{number}-server", kernel]
        if not headless:
            packages.append(f"nvidia-driver-{suffix}")
        result.update(
            kernel_package=kernel,
            precompiled=[f"linux-modules-nvidia-{suffix}-{k}" for k in (kernels or [])],
        )
    elif source == "distribution":
        raise AnsibleFilterError(
            f"nvidia_driver_packages: source distribution is known for Debian and Ubuntu, not {distribution!r}; "
            "use source cuda or mirror"
        )
    else:
        # NVIDIA's CUDA repository (and mirrors of it). Debian: the compute-only set NVIDIA documents
        # (nvidia-driver-cuda and the kernel module package, names without the branch: the apt pin and NVIDIA's
        # pinning package hold the branch), or the cuda-drivers / nvidia-open metapackages. Ubuntu: Ubuntu's naming
        # with the branch in the names until 590, without from 590.
        versioned = number < CUDA_UNVERSIONED_FROM
        if distribution == "Ubuntu":
            tag = f"-{number}" if versioned else ""
            flavour_tag = "-open" if open_ else ""
            kernel = f"nvidia-dkms{tag}{flavour_tag}"
            headless_set = [f"nvidia-headless-no-dkms{tag}{flavour_tag}", f"nvidia-utils{tag}", kernel]
        else:
            kernel = "nvidia-kernel-open-dkms" if open_ else "nvidia-kernel-dkms"
            headless_set = ["nvidia-driver-cuda", kernel]
        if headless:
            packages = headless_set
        else:
            meta = ("nvidia-open" if open_ else "cuda-drivers") + (f"-{number}" if versioned else "")
            packages = [meta]
            kernel = meta
        if number >= CUDA_PINNING_FROM:
            result["pinning"] = [f"nvidia-driver-pinning-{number}"]
        result.update(kernel_package=kernel)
    # Ubuntu ships nvidia-persistenced inside nvidia-compute-utils, which the headless package pulls in.
    if persistenced and not (source == "distribution" and distribution == "Ubuntu"):
        packages.append("nvidia-persistenced")
    result["packages"] = list(dict.fromkeys(packages))
    return result


# ---------------------------------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------------------------------


def _smi_value(value: str) -> str | None:
    value = value.strip()
    return None if value in SMI_MISSING else value


def _mib(value: str | None) -> int | None:
    if value is None:
        return None
    match = re.fullmatch(r"(\d+)(?:\s*MiB)?", value)
    return int(match.group(1)) if match else None


def nvidia_smi_gpus(text: str, fields: list[str] | tuple[str, ...] = SMI_FIELDS) -> list[dict[str, Any]]:
    """The GPUs from `nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`.

    Each GPU: index, name, uuid, memory_total_mib, pci_bus_id, compute_capability (None when the driver does not
    report a field). A header line, when present, is skipped; units ('81920 MiB') are accepted.
    """
    if not isinstance(text, str):
        raise AnsibleFilterError(f"nvidia_smi_gpus expects nvidia-smi's CSV text, not {type(text).__name__}")
    fields = [f.strip() for f in fields]
    gpus: list[dict[str, Any]] = []
    rows = list(csv.reader(text.splitlines(), skipinitialspace=True))
    for number, row in enumerate(rows, start=1):
        if not row or not any(cell.strip() for cell in row):
            continue
        names = [re.sub(r"\s*\[.*\]$", "", cell.strip()) for cell in row]
        if names == fields:
            continue
        if len(row) != len(fields):
            raise AnsibleFilterError(
                f"nvidia_smi_gpus: line {number} has {len(row)} values, {len(fields)} expected "
                f"({', '.join(fields)}): {','.join(row)!r}"
            )
        values = dict(zip(fields, (_smi_value(cell) for cell in row)))
        index = values.get("index")
        gpus.append(
            {
                "index": int(index) if index is not None and index.isdigit() else None,
                "name": values.get("name"),
                "uuid": values.get("uuid"),
                "memory_total_mib": _mib(values.get("memory.total")),
                "pci_bus_id": values.get("pci.bus_id"),
                "compute_capability": values.get("compute_cap"),
            }
        )
    return gpus


def nvidia_pci_gpus(text: str) -> list[dict[str, str]]:
    """NVIDIA GPUs on the PCI bus from lines 'ADDRESS VENDOR DEVICE CLASS' (sysfs values: '0000:07:00.0 0x10de
    0x20b2 0x030200'), as {pci_bus_id, device_id} with device_id as lspci writes it ('10de:20b2')."""
    gpus: list[dict[str, str]] = []
    for line in str(text or "").splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue
        address, vendor, device, klass = (p.lower() for p in parts)
        if vendor == NVIDIA_PCI_VENDOR and klass.startswith(PCI_GPU_CLASSES):
            gpus.append({"pci_bus_id": address, "device_id": f"10de:{device.removeprefix('0x')}"})
    return sorted(gpus, key=lambda g: g["pci_bus_id"])


def gpu_generation(device_id: str) -> str:
    """The generation of a GPU from its PCI device id ('10de:1db4' -> 'Volta'); '' when not known."""
    device = device_id.lower().rsplit(":", 1)[-1].removeprefix("0x")
    if len(device) != 4:
        return ""
    if device[:2] == "1d":
        return "Volta" if device[2] in "89abcdef" else "Pascal"
    return GPU_GENERATIONS.get(device[:2], "")


def nvidia_driver_gpu_support(pci_gpus: list[dict[str, str]], branch: str | int, flavour: str) -> list[str]:
    """Warnings for GPUs on the PCI bus that the branch or the kernel module flavour may not drive."""
    warnings: list[str] = []
    number = int(branch)
    by_generation: dict[str, list[str]] = {}
    for gpu in pci_gpus:
        by_generation.setdefault(gpu_generation(gpu["device_id"]), []).append(gpu["device_id"])
    for generation, ids in sorted(by_generation.items()):
        devices = f"{generation} GPUs ({', '.join(sorted(set(ids)))})"
        if generation in GENERATIONS_BEFORE_TURING and number > LAST_BRANCH_BEFORE_TURING:
            warnings.append(
                f"{devices}: branch {number} does not support them; {LAST_BRANCH_BEFORE_TURING} is the last."
            )
        if generation in GENERATIONS_BEFORE_TURING and flavour == "open":
            warnings.append(f"{devices}: the open kernel modules need Turing or newer; use flavour proprietary.")
        if generation == "Blackwell" and number < FIRST_BRANCH_FOR_BLACKWELL:
            warnings.append(f"{devices}: branch {number} predates them; use {FIRST_BRANCH_FOR_BLACKWELL} or later.")
        if generation == "Blackwell" and flavour != "open":
            warnings.append(f"{devices}: they need the open kernel modules; use flavour open.")
    return warnings


def nvidia_secure_boot(content_b64: str) -> bool:
    """Whether Secure Boot is on, from the EFI variable SecureBoot-8be4df61-... as slurp returns it (base64): 4 bytes
    of attributes, then 1 when enabled."""
    if not content_b64:
        return False
    try:
        data = base64.b64decode(content_b64, validate=True)
    except (ValueError, TypeError):
        return False
    return len(data) >= 5 and data[4] == 1


# EFI_CERT_X509_GUID (a5c059a1-94e4-4aa7-87b5-ab155c2bf072) as it is stored: the first three fields little-endian.
EFI_CERT_X509_GUID = bytes.fromhex("a159c0a5e494a74a87b5ab155c2bf072")
# An EFI_SIGNATURE_LIST header: the type GUID, then the list's, the header's and each signature's size (uint32 LE).
_ESL_HEADER = 28
# Each signature in a list starts with its owner's GUID.
_ESL_OWNER = 16


def _der_certificate(cert: bytes) -> bytes:
    """The DER bytes of a certificate given as DER (DKMS's /var/lib/dkms/mok.pub) or PEM."""
    if cert.lstrip().startswith(b"-----BEGIN"):
        body = re.search(rb"-----BEGIN [A-Z0-9 ]+-----(.*?)-----END", cert, re.S)
        return base64.b64decode(b"".join(body.group(1).split())) if body else b""
    return cert


def _efi_x509_certificates(data: bytes) -> list[bytes]:
    """The X.509 certificates of a run of EFI_SIGNATURE_LISTs (UEFI 2.x, 32.4.1); stops at the first malformed list."""
    certificates: list[bytes] = []
    offset = 0
    while offset + _ESL_HEADER <= len(data):
        kind = data[offset : offset + 16]
        list_size, header_size, signature_size = (
            int.from_bytes(data[offset + 16 + 4 * i : offset + 20 + 4 * i], "little") for i in range(3)
        )
        if list_size < _ESL_HEADER + header_size or offset + list_size > len(data) or signature_size <= _ESL_OWNER:
            break
        if kind == EFI_CERT_X509_GUID:
            start = offset + _ESL_HEADER + header_size
            for entry in range(start, offset + list_size - signature_size + 1, signature_size):
                certificates.append(data[entry + _ESL_OWNER : entry + signature_size])
        offset += list_size
    return certificates


def nvidia_mok_enrolled(moklist_b64: str, cert_b64: str) -> bool:
    """Whether a certificate (base64 of DER or PEM, as slurp returns DKMS's /var/lib/dkms/mok.pub) is among the
    Machine Owner Keys shim passed to the kernel: the EFI variable MokListRT-605dab50-e046-4300-abb6-3dd810dd8b23 as
    slurp returns it (base64: 4 bytes of attributes, then EFI_SIGNATURE_LISTs). What mokutil --test-key answers,
    without needing mokutil on the node (minimal installs and container images lack it)."""
    if not moklist_b64 or not cert_b64:
        return False
    try:
        moklist = base64.b64decode(moklist_b64, validate=True)
        cert = _der_certificate(base64.b64decode(cert_b64, validate=True))
    except (ValueError, TypeError):
        return False
    return bool(cert) and cert in _efi_x509_certificates(moklist[4:])


# ---------------------------------------------------------------------------------------------------------------------
# The reboot decision
# ---------------------------------------------------------------------------------------------------------------------


def nvidia_driver_reboot(
    installed: str, loaded: str = "", nouveau_loaded: bool = False, gpus_present: bool = True
) -> dict[str, Any]:
    """What makes the installed driver the running one: {action: none|load|reboot|skip, reboot_required, reason}.

    installed      the version of the module the next boot loads (modinfo), '' when none is built
    loaded         the version of the nvidia module in the running kernel, '' when none is loaded
    nouveau_loaded whether nouveau holds the GPUs now (the nvidia module cannot load beside it)
    gpus_present   whether the PCI bus shows an NVIDIA GPU (without one the module refuses to load)
    """
    installed = upstream_version(installed) if installed else ""
    loaded = loaded_version(loaded)
    if not installed:
        return {
            "action": "none",
            "reboot_required": False,
            "reason": "no nvidia module is built for the kernel that boots next",
        }
    if nouveau_loaded:
        return {
            "action": "reboot",
            "reboot_required": True,
            "reason": f"nouveau is loaded; a reboot (with nouveau blacklisted) loads nvidia {installed}",
        }
    if not loaded:
        if not gpus_present:
            return {
                "action": "skip",
                "reboot_required": False,
                "reason": "no NVIDIA GPU on the PCI bus: the module is not loaded (it would refuse to load)",
            }
        return {"action": "load", "reboot_required": False, "reason": f"no driver loaded: loading nvidia {installed}"}
    if compare_versions(loaded, installed) != 0:
        return {
            "action": "reboot",
            "reboot_required": True,
            "reason": f"nvidia {loaded} is loaded but {installed} is installed for the next boot",
        }
    return {"action": "none", "reboot_required": False, "reason": f"nvidia {loaded} is loaded and installed"}


class FilterModule:
    """kubegpu.node NVIDIA driver filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "nvidia_smi_gpus": nvidia_smi_gpus,
            "nvidia_pci_gpus": nvidia_pci_gpus,
            "nvidia_driver_packages": nvidia_driver_packages,
            "nvidia_driver_branches": nvidia_driver_branches,
            "nvidia_driver_candidate": nvidia_driver_candidate,
            "nvidia_driver_kernels": nvidia_driver_kernels,
            "nvidia_driver_reboot": nvidia_driver_reboot,
            "nvidia_driver_madison": nvidia_driver_madison,
            "nvidia_driver_pinned": nvidia_driver_pinned,
            "nvidia_driver_install_plan": nvidia_driver_install_plan,
            "nvidia_driver_preferences": nvidia_driver_preferences,
            "nvidia_driver_gpu_support": nvidia_driver_gpu_support,
            "nvidia_secure_boot": nvidia_secure_boot,
            "nvidia_mok_enrolled": nvidia_mok_enrolled,
            "nvidia_driver_loaded": loaded_version,
            "nvidia_driver_apt_source": nvidia_driver_apt_source,
        }

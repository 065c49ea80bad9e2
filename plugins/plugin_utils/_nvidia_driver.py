# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of kubegpu.node.nvidia_driver_plan (the role kubegpu.node.nvidia_driver), not a public API: it can
# change at any time.
#
# Pure: the action reads the node (one command, plus the source check of _apt) and this module parses what it read
# and decides: the packages and their versions, the kernels, the refusals, the files, the reboot, the facts.

from __future__ import annotations

import base64
import csv
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _apt

SOURCES = ("distribution", "cuda", "mirror")
FLAVOURS = ("proprietary", "open")

# Files the role owns on the node.
FACT_FILE = "/etc/ansible/facts.d/nvidia.fact"
BLACKLIST_FILE = "/etc/modprobe.d/kubegpu-blacklist-nouveau.conf"
SOURCE_FILE = "/etc/apt/sources.list.d/kubegpu-nvidia-driver.sources"
KEYRING_FILE = "/etc/apt/keyrings/kubegpu-nvidia-driver.asc"
PREFERENCES_FILE = "/etc/apt/preferences.d/kubegpu-nvidia-driver.pref"
OWN_FILES = (KEYRING_FILE, SOURCE_FILE, PREFERENCES_FILE, BLACKLIST_FILE, FACT_FILE)

BLACKLIST = (
    "# Written by kubegpu.node.nvidia_driver: nouveau must not claim NVIDIA GPUs (it is also kept out of the "
    "initramfs).\nblacklist nouveau\noptions nouveau modeset=0\n"
)

# A driver installed by NVIDIA's .run installer has its installer and uninstaller in /usr/bin; nvidia-uninstall
# removes both (and the driver), but leaves /var/log/nvidia-installer.log behind, so a log is a trace of the past,
# not a sign of what is installed. The GPU Operator's driver container mounts the driver's root file system at
# /run/nvidia/driver.
RUNFILE_MARKERS = ("/usr/bin/nvidia-uninstall", "/usr/bin/nvidia-installer")
OPERATOR_MARKER = "/run/nvidia/driver"

# The EFI variable that says whether Secure Boot is on (4 bytes of attributes, then 1 when enabled), the certificate
# DKMS signs modules with (DER; DKMS generates it at its first build where it signs; it must be enrolled), and the
# variable where shim hands the enrolled Machine Owner Keys to the kernel (what mokutil --test-key reads).
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
DKMS_MOK = "/var/lib/dkms/mok.pub"
MOKLIST_VAR = "/sys/firmware/efi/efivars/MokListRT-605dab50-e046-4300-abb6-3dd810dd8b23"

# The fields the role asks nvidia-smi for, in this order; compute_cap is unknown to drivers older than 510, which
# refuse the whole query, so the read asks again without it.
SMI_FIELDS = ("index", "name", "uuid", "memory.total", "pci.bus_id", "compute_cap")
SMI_OLD_FIELDS = tuple(f for f in SMI_FIELDS if f != "compute_cap")
SMI_MISSING = ("[N/A]", "[Not Supported]", "N/A", "")

# NVIDIA's CUDA repository names drivers without the branch from 590 on; from 580 a pinning package per branch holds
# a branch (installed before the driver). Firmware for the GSP is packaged separately by Debian from 525.
CUDA_UNVERSIONED_FROM = 590
CUDA_PINNING_FROM = 580
DEBIAN_GSP_FIRMWARE_FROM = 525
PINNING_PREFIX = "nvidia-driver-pinning-"

# NVIDIA's CUDA repositories and their signing keys. Every deb repository up to Debian 12 and Ubuntu 24.04 is signed
# by the key 3bf863cc (docs.nvidia.com/datacenter/tesla/driver-installation-guide, "GPG Keys Used to Sign the
# Packages": deb-based distributions 3bf863cc), whose fingerprint is EB69 3B30 35CD 5710 E231 E123 A4B4 6996 3BF8
# 63CC (NVIDIA/cuda-repo-management, SIGNATURES.md, "Primary key fingerprint"). Debian 13's repository has a key of
# its own, 8793F200 (NVIDIA/cuda-repo-management#39 and #34: the old key's SHA-1 binding signature is refused by
# Debian 13's apt from 2026-02-01), fingerprint 02182E60104FCDC26EAE1B8597A5D4CB8793F200 as its 8793F200.pub has it.
CUDA_BASE_URL = "https://developer.download.nvidia.com/compute/cuda/repos"
CUDA_KEY_FINGERPRINTS = ("EB693B3035CD5710E231E123A4B469963BF863CC", "02182E60104FCDC26EAE1B8597A5D4CB8793F200")
CUDA_KEY_FILE = "3bf863cc.pub"
CUDA_KEY_FILES = {"debian13": "8793F200.pub"}

# The driver's packages in Debian, Ubuntu and NVIDIA's repository (all built from the driver and versioned with it).
DRIVER_PACKAGES_PATTERN = (
    "/^(nvidia-|libnvidia-|libcuda|cuda-drivers|firmware-nvidia|xserver-xorg-video-nvidia|libxnvctrl)/"
)
# PCI device ids of NVIDIA GPU generations, by their first two hex digits (a coarse map: it only feeds warnings).
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
LAST_BRANCH_BEFORE_TURING = 580
FIRST_BRANCH_FOR_BLACKWELL = 570

NOTHING_CHANGED = "Nothing was changed."
# What systemctl is-enabled says of a unit that needs no enabling.
ENABLED_STATES = ("enabled", "static", "alias", "indirect", "generated")


class Refusal(Exception):
    """A reason not to touch the node; its text says what to do, and that nothing was changed."""


# ---------------------------------------------------------------------------------------------------------------------
# Versions
# ---------------------------------------------------------------------------------------------------------------------


def upstream_version(package_version: str) -> str:
    """NVIDIA's version inside a Debian package version: '1:535.261.03-1~deb12u1' -> '535.261.03'."""
    version = str(package_version or "").strip()
    if ":" in version:
        version = version.split(":", 1)[1]
    if "-" in version:
        version = version.rsplit("-", 1)[0]
    return version


def driver_branch(version: str | None) -> str:
    """The branch of a driver version: '535.261.03' -> '535'; '' when there is no version."""
    match = re.match(r"\s*(\d+)", upstream_version(version or ""))
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
    text = str(text or "").strip()
    if re.fullmatch(r"\d+(\.\d+)+", text):
        return text
    match = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else ""


def branches(package_versions: Sequence[str]) -> list[str]:
    """The branches a source offers, from the versions of a package, newest first."""
    return sorted({driver_branch(v) for v in package_versions if driver_branch(v)}, key=int, reverse=True)


def candidate(package_versions: Sequence[str], branch: str | int, exact: str | None = None) -> str:
    """The newest package version in the branch (the exact one when asked for), '' when the source has none."""
    return _apt.newest(v.strip() for v in package_versions if v.strip() and version_in_branch(v.strip(), branch, exact))


def pinned(packages: Sequence[str], offered: dict[str, list[str]], branch: str | int, exact: str = "") -> list[str]:
    """Each package as apt installs it: 'name=version' at the branch's (or the exact) version where the source offers
    one in the branch, the bare name otherwise (packages versioned apart from the driver, such as nvidia-persistenced
    on Debian, or extra packages)."""
    result: list[str] = []
    for name in dict.fromkeys(packages):
        versions = offered.get(name, [])
        chosen = candidate(versions, branch, exact) or candidate(versions, branch)
        result.append(f"{name}={chosen}" if chosen else name)
    return result


def preferences(branch: str | int, exact: str = "") -> str:
    """An apt preferences file that keeps every driver package at the branch (or the exact version): without it apt
    resolves the driver's exact-version dependencies (nvidia-alternative, libnvidia-*) to the newest version and
    refuses, or pulls a newer branch in. Packages versioned apart from the driver do not match."""
    version = f"{upstream_version(exact)}*" if exact else f"{branch}.*"
    return (
        "# Written by kubegpu.node.nvidia_driver: apt keeps the NVIDIA driver at this version, whatever newer the\n"
        "# sources offer.\n"
        f"Package: {DRIVER_PACKAGES_PATTERN}\n"
        f"Pin: version {version}\n"
        "Pin-Priority: 1001\n"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Sources and packages
# ---------------------------------------------------------------------------------------------------------------------


def cuda_repository(distribution: str, version: str, major: str, architecture: str) -> tuple[str, str]:
    """NVIDIA's CUDA repository for a system (URL with a trailing slash) and the name of its key file next to it."""
    system = distribution.lower() + (version.replace(".", "") if distribution == "Ubuntu" else major)
    arch = "sbsa" if architecture == "aarch64" else "x86_64"
    return f"{CUDA_BASE_URL}/{system}/{arch}/", CUDA_KEY_FILES.get(system, CUDA_KEY_FILE)


def apt_source(
    source: str,
    codename: str = "",
    debian_mirror: str = "http://deb.debian.org/debian",
    security_mirror: str = "http://deb.debian.org/debian-security",
    url: str = "",
    suite: str = "/",
    components: Sequence[str] = (),
    keyring: str = _apt.KEYRING_PLACEHOLDER,
) -> str:
    """The deb822 package source: Debian's components that hold the driver (release, updates and security), or the
    repository of sources cuda and mirror signed by `keyring` (a flat repository has suite '/' and no components)."""
    _check_choice("source", source, SOURCES)
    if source == "distribution":
        stanzas = [(debian_mirror, f"{codename} {codename}-updates"), (security_mirror, f"{codename}-security")]
        return (
            "# Written by kubegpu.node.nvidia_driver: the components Debian ships the NVIDIA driver in.\n"
            + "\n".join(
                f"Types: deb\nURIs: {uri}\nSuites: {suites}\nComponents: contrib non-free non-free-firmware\n"
                "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
                for uri, suites in stanzas
            )
        )
    if not url:
        raise Refusal(f"source {source} needs the repository's URL (nvidia_driver_repository_url). {NOTHING_CHANGED}")
    return _apt.deb822(
        f"Written by kubegpu.node.nvidia_driver: NVIDIA's driver packages ({source}).",
        [url],
        [suite],
        components,
        keyring,
    )


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}, not {value!r}")


def packages(
    branch: str | int,
    source: str = "distribution",
    distribution: str = "Debian",
    flavour: str = "proprietary",
    persistenced: bool = True,
    headless: bool = True,
    kernels: Sequence[str] = (),
) -> dict[str, Any]:
    """The packages of a driver branch: {packages, pinning, precompiled, kernel_package}.

    packages        what apt installs (and the role holds), kernel module package included
    pinning         NVIDIA's pinning packages, installed first (cuda/mirror from 580)
    precompiled     Ubuntu's signed precompiled module packages per kernel (used instead of DKMS when all exist)
    kernel_package  the package whose versions say which branches the source offers
    """
    _check_choice("source", source, SOURCES)
    _check_choice("flavour", flavour, FLAVOURS)
    if not re.fullmatch(r"\d{3,}", str(branch)):
        raise ValueError(f"the branch is a number such as 535 or 580, not {branch!r}")
    number = int(branch)
    open_ = flavour == "open"
    result: dict[str, Any] = {"packages": [], "pinning": [], "precompiled": [], "kernel_package": ""}

    if source == "distribution" and distribution == "Debian":
        kernel = "nvidia-open-kernel-dkms" if open_ else "nvidia-kernel-dkms"
        names = [kernel, "nvidia-smi", "libcuda1", "libnvidia-ml1"]
        if number >= DEBIAN_GSP_FIRMWARE_FROM:
            names.append("firmware-nvidia-gsp")
        if not headless:
            names.append("nvidia-driver")
        result["kernel_package"] = kernel
    elif source == "distribution" and distribution == "Ubuntu":
        suffix = f"{number}-server" + ("-open" if open_ else "")
        kernel = f"nvidia-dkms-{suffix}"
        names = [f"nvidia-headless-no-dkms-{suffix}", f"nvidia-utils-{number}-server", kernel]
        if not headless:
            names.append(f"nvidia-driver-{suffix}")
        result.update(kernel_package=kernel, precompiled=[f"linux-modules-nvidia-{suffix}-{k}" for k in kernels])
    elif source == "distribution":
        raise ValueError(
            f"source distribution is known for Debian and Ubuntu, not {distribution!r}; use cuda or mirror"
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
            names = headless_set
        else:
            meta = ("nvidia-open" if open_ else "cuda-drivers") + (f"-{number}" if versioned else "")
            names = [meta]
            kernel = meta
        if number >= CUDA_PINNING_FROM:
            result["pinning"] = [f"{PINNING_PREFIX}{number}"]
        result["kernel_package"] = kernel
    # Ubuntu ships nvidia-persistenced inside nvidia-compute-utils, which the headless package pulls in.
    if persistenced and not (source == "distribution" and distribution == "Ubuntu"):
        names.append("nvidia-persistenced")
    result["packages"] = list(dict.fromkeys(names))
    return result


# ---------------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """A kernel as the node read found it: its headers installed, the version of the nvidia module built for it."""

    headers: bool = False
    module: str = ""


@dataclass(frozen=True)
class Kernels:
    targets: list[str]
    next_boot: str
    skipped: list[str] = field(default_factory=list)


def choose_kernels(
    boot: Sequence[str],
    running: str,
    wanted: Sequence[str],
    found: dict[str, Kernel],
    dkms: bool = True,
) -> Kernels:
    """The kernels to build the module for, and the one that boots next (the newest of them).

    `wanted` is the user's list. Without one: the newest kernel in /boot (the one that boots next), and the running
    kernel too when it can have the module: its headers are installed (DKMS), or the modules are precompiled. A kernel
    upgraded and not rebooted yet often has no headers for the running kernel: nothing can be loaded until the reboot
    then, and the module is built for the next boot only (`skipped` names the running kernel).
    """
    if wanted:
        targets = list(dict.fromkeys(k for k in wanted if k))
        return Kernels(targets=targets, next_boot=_apt.newest(targets))
    installed = [k for k in boot if k]
    latest = _apt.newest(installed) or running
    if not latest:
        raise Refusal(f"no kernel to build the nvidia module for: none runs, none is in /boot. {NOTHING_CHANGED}")
    targets = [latest]
    skipped: list[str] = []
    if running and running != latest:
        if found.get(running, Kernel()).headers or not dkms:
            targets.insert(0, running)
        else:
            skipped.append(running)
    return Kernels(targets=targets, next_boot=latest, skipped=skipped)


# ---------------------------------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------------------------------


def _smi_value(value: str) -> str | None:
    value = value.strip()
    return None if value in SMI_MISSING else value


def _mib(value: str | None) -> int | None:
    match = re.fullmatch(r"(\d+)(?:\s*MiB)?", value or "")
    return int(match.group(1)) if match else None


def smi_gpus(text: str, fields: Sequence[str] = SMI_FIELDS) -> list[dict[str, Any]]:
    """The GPUs from `nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`.

    Each GPU: index, name, uuid, memory_total_mib, pci_bus_id, compute_capability (None when the driver does not
    report a field). A header line, when present, is skipped; units ('81920 MiB') are accepted.
    """
    fields = [f.strip() for f in fields]
    gpus: list[dict[str, Any]] = []
    for number, row in enumerate(csv.reader(str(text or "").splitlines(), skipinitialspace=True), start=1):
        if not row or not any(cell.strip() for cell in row):
            continue
        if [re.sub(r"\s*\[.*\]$", "", cell.strip()) for cell in row] == fields:
            continue
        if len(row) != len(fields):
            raise ValueError(
                f"nvidia-smi's line {number} has {len(row)} values, {len(fields)} expected ({', '.join(fields)}): "
                f"{','.join(row)!r}"
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


def gpu_generation(device_id: str) -> str:
    """The generation of a GPU from its PCI device id ('10de:1db4' -> 'Volta'); '' when not known."""
    device = device_id.lower().rsplit(":", 1)[-1].removeprefix("0x")
    if len(device) != 4:
        return ""
    if device[:2] == "1d":
        return "Volta" if device[2] in "89abcdef" else "Pascal"
    return GPU_GENERATIONS.get(device[:2], "")


def gpu_support(pci_gpus: Sequence[dict[str, str]], branch: str | int, flavour: str) -> list[str]:
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


# ---------------------------------------------------------------------------------------------------------------------
# Secure Boot
# ---------------------------------------------------------------------------------------------------------------------

# EFI_CERT_X509_GUID (a5c059a1-94e4-4aa7-87b5-ab155c2bf072) as it is stored: the first three fields little-endian.
EFI_CERT_X509_GUID = bytes.fromhex("a159c0a5e494a74a87b5ab155c2bf072")
# An EFI_SIGNATURE_LIST header: the type GUID, then the list's, the header's and each signature's size (uint32 LE).
_ESL_HEADER = 28
# Each signature in a list starts with its owner's GUID.
_ESL_OWNER = 16


def secure_boot_on(variable: bytes | None) -> bool:
    """Whether Secure Boot is on, from the EFI variable SecureBoot-8be4df61-...: 4 bytes of attributes, then 1."""
    return bool(variable) and len(variable) >= 5 and variable[4] == 1


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


def mok_enrolled(moklist: bytes | None, cert: bytes | None) -> bool:
    """Whether a certificate (DER or PEM, DKMS's /var/lib/dkms/mok.pub) is among the Machine Owner Keys shim passed to
    the kernel: the EFI variable MokListRT-605dab50-... (4 bytes of attributes, then EFI_SIGNATURE_LISTs). What
    mokutil --test-key answers, without needing mokutil on the node (minimal installs and images lack it)."""
    if not moklist or not cert:
        return False
    der = _der_certificate(cert)
    return bool(der) and der in _efi_x509_certificates(moklist[4:])


# ---------------------------------------------------------------------------------------------------------------------
# Refusals and the reboot decision
# ---------------------------------------------------------------------------------------------------------------------


def foreign_driver(found: Sequence[str]) -> str:
    """Why packages must not go on top of a driver installed another way ('' when none is): what is installed counts,
    the .run installer's log does not (it stays after nvidia-uninstall)."""
    found = [path for path in found if path in (*RUNFILE_MARKERS, OPERATOR_MARKER)]
    if not found:
        return ""
    if OPERATOR_MARKER in found:
        advice = (
            "The GPU Operator manages the driver of this node: disable its driver (driver.enabled=false) before "
            "installing one on the host, or leave this node to the Operator."
        )
    else:
        advice = (
            "It was installed with the .run installer of NVIDIA: remove it first (nvidia-uninstall), then run the "
            "role again."
        )
    return f"a driver that kubegpu.node.nvidia_driver must not touch is installed: {', '.join(found)}. {advice}"


@dataclass(frozen=True)
class Decision:
    """What makes the installed driver the running one.

    action           none | load | reboot | skip
    reboot_required  a reboot is needed, and the kernel that boots next has a module that fits the installed packages
    next_boot_ready  the kernel that boots next has the nvidia module of the installed packages
    """

    action: str
    reboot_required: bool
    reason: str
    installed_version: str
    loaded_version: str
    next_boot_ready: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "reboot_required": self.reboot_required,
            "reason": self.reason,
            "installed_version": self.installed_version,
            "loaded_version": self.loaded_version,
            "next_boot_ready": self.next_boot_ready,
        }


def reboot_decision(
    installed: str,
    loaded: str = "",
    nouveau_loaded: bool = False,
    gpus_present: bool = True,
    running_module: str | None = None,
    running_kernel: str = "",
    next_boot: str = "",
    packaged: str | None = None,
) -> Decision:
    """The reboot decision.

    installed       the version of the module the next boot loads (modinfo), '' when none is built
    loaded          the version of the nvidia module in the running kernel, '' when none is loaded
    nouveau_loaded  whether nouveau holds the GPUs now (the nvidia module cannot load beside it)
    gpus_present    whether the PCI bus shows an NVIDIA GPU (without one the module refuses to load)
    running_module  the version of the module built for the running kernel ('' when none; None: the same as the next
                    boot's, the running kernel being the one that boots next)
    packaged        the driver version the installed packages are at (None: not known, taken as `installed`); a next
                    boot whose module is missing or differs from it is not one to reboot into
    """
    installed = upstream_version(installed)
    loaded = loaded_version(loaded)
    running_module = installed if running_module is None else upstream_version(running_module)
    packaged = installed if packaged is None else upstream_version(packaged)
    boot = next_boot or "the kernel that boots next"
    ready = bool(installed) and installed == packaged

    def decide(action: str, reason: str, reboot: bool = False) -> Decision:
        return Decision(action, reboot and ready, reason, installed, loaded, ready)

    if not installed:
        return decide("none", f"no nvidia module is built for {boot}")
    if not ready:
        return decide(
            "none",
            f"{boot} has the nvidia module {installed}, but the packages are at {packaged or 'no version'}: "
            "not a boot to reboot into until a run of the role succeeds",
        )
    if nouveau_loaded:
        return decide(
            "reboot", f"nouveau is loaded; a reboot (with nouveau blacklisted) loads nvidia {installed}", True
        )
    if not loaded:
        if not gpus_present:
            return decide("skip", "no NVIDIA GPU on the PCI bus: the module is not loaded (it would refuse to load)")
        if running_module == installed:
            return decide("load", f"no driver loaded: loading nvidia {installed}")
        running = running_kernel or "the running kernel"
        has = f"has nvidia {running_module}" if running_module else "has no nvidia module"
        return decide(
            "reboot",
            f"nothing is loaded and {running} {has}; nvidia {installed} is built for {boot}, which a reboot loads",
            True,
        )
    if _apt.debian_version_compare(loaded, installed) != 0:
        return decide("reboot", f"nvidia {loaded} is loaded but {installed} is installed for the next boot", True)
    return decide("none", f"nvidia {loaded} is loaded and installed")


# ---------------------------------------------------------------------------------------------------------------------
# The node read: one command, its output parsed
# ---------------------------------------------------------------------------------------------------------------------

# Environment: KERNELS (more kernels to report than the running one and those in /boot), PACKAGES (dpkg-query names
# and patterns), FULL=1 for the reads that hold for a whole run (the role's files, a foreign driver, the initramfs,
# Secure Boot, free space), FILES, MARKERS, BLACKLIST (the blacklist's path inside the initramfs).
READ_SCRIPT = r"""set -u
kernels=$( { uname -r; for image in /boot/vmlinuz-*; do [ -e "$image" ] && echo "${image#/boot/vmlinuz-}"; done
  for k in ${KERNELS:-}; do echo "$k"; done; } | sort -u)
echo "@@running"; uname -r
echo "@@boot"; for image in /boot/vmlinuz-*; do [ -e "$image" ] && echo "${image#/boot/vmlinuz-}"; done
echo "@@modules"
for k in $kernels; do
  headers=no; [ -e "/lib/modules/$k/build/Makefile" ] && headers=yes
  v=$(modinfo -k "$k" -F version nvidia 2>/dev/null || modinfo -k "$k" -F version nvidia-current 2>/dev/null)
  echo "$k $headers ${v:-}"
done
echo "@@dpkg"; dpkg-query -W -f='${Package}|${Version}|${Status}\n' ${PACKAGES:-} 2>/dev/null
echo "@@loaded"; cat /sys/module/nvidia/version 2>/dev/null || cat /proc/driver/nvidia/version 2>/dev/null
echo "@@nouveau"; [ -e /sys/module/nouveau ] && echo loaded
echo "@@persistenced"
systemctl is-enabled nvidia-persistenced.service 2>/dev/null || true
systemctl is-active nvidia-persistenced.service 2>/dev/null || true
if [ -r /sys/module/nvidia/version ] || [ -r /proc/driver/nvidia/version ]; then
  fields=$SMI_FIELDS
  out=$(nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits 2>&1); rc=$?
  if [ "$rc" -ne 0 ] && printf '%s' "$out" | grep -q compute_cap; then
    fields=$SMI_OLD_FIELDS
    out=$(nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits 2>&1); rc=$?
  fi
  echo "@@smi $rc $fields"; printf '%s\n' "$out"
fi
[ "${FULL:-0}" = 1 ] || exit 0
for f in ${FILES:-}; do
  if [ -f "$f" ]; then echo "@@file $f"; base64 "$f"; else echo "@@nofile $f"; fi
done
echo "@@foreign"; for p in ${MARKERS:-}; do if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi; done
next=$(for image in /boot/vmlinuz-*; do [ -e "$image" ] && echo "${image#/boot/vmlinuz-}"; done | sort -V | tail -n 1)
if [ -n "$next" ] && [ -e "/boot/initrd.img-$next" ]; then
  if command -v lsinitramfs >/dev/null 2>&1; then
    echo "@@initramfs $next $(lsinitramfs "/boot/initrd.img-$next" 2>/dev/null | grep -cxF "$BLACKLIST")"
  else
    echo "@@initramfs $next unreadable"
  fi
fi
echo "@@secureboot"; [ -r "$SB_VAR" ] && base64 "$SB_VAR"
echo "@@mok"; [ -r "$MOK" ] && base64 "$MOK"
echo "@@moklist"; [ -r "$MOKLIST" ] && base64 "$MOKLIST"
echo "@@df"; df -Pm /usr /var 2>/dev/null
exit 0
"""


def read_argv(kernels: Sequence[str], package_names: Sequence[str], full: bool) -> list[str]:
    env = [
        f"KERNELS={' '.join(kernels)}",
        f"PACKAGES={' '.join(package_names)}",
        f"FULL={1 if full else 0}",
        f"FILES={' '.join(OWN_FILES)}",
        f"MARKERS={' '.join((*RUNFILE_MARKERS, OPERATOR_MARKER))}",
        f"BLACKLIST={BLACKLIST_FILE.lstrip('/')}",
        f"SB_VAR={SECURE_BOOT_VAR}",
        f"MOK={DKMS_MOK}",
        f"MOKLIST={MOKLIST_VAR}",
        f"SMI_FIELDS={','.join(SMI_FIELDS)}",
        f"SMI_OLD_FIELDS={','.join(SMI_OLD_FIELDS)}",
    ]
    return ["env", *env, "sh", "-c", READ_SCRIPT, "nvidia-driver-read"]


@dataclass
class NodeRead:
    """What one read of the node found (the parts of a full read are empty after a node-only one)."""

    running: str = ""
    boot: list[str] = field(default_factory=list)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    dpkg: dict[str, _apt.Installed] = field(default_factory=dict)
    loaded: str = ""
    nouveau: bool = False
    persistenced_enabled: bool = False
    persistenced_active: bool = False
    smi_answers: bool = False
    smi_rc: int | None = None
    smi_fields: list[str] = field(default_factory=list)
    smi_text: str = ""
    full: bool = False
    files: dict[str, str | None] = field(default_factory=dict)
    foreign: list[str] = field(default_factory=list)
    initramfs_kernel: str = ""
    initramfs_has_blacklist: bool | None = None
    secure_boot: bytes | None = None
    mok: bytes | None = None
    moklist: bytes | None = None
    free_mib: dict[str, int] = field(default_factory=dict)


def _b64(lines: list[str]) -> bytes | None:
    data = "".join(line.strip() for line in lines)
    return base64.b64decode(data) if data else None


def parse_read(stdout: str) -> NodeRead:
    node = NodeRead()
    for header, lines in _apt.sections(stdout):
        name, _sep, rest = header.partition(" ")
        if name == "running":
            node.running = "".join(lines).strip()
        elif name == "boot":
            node.boot = [line.strip() for line in lines if line.strip()]
        elif name == "modules":
            for line in lines:
                parts = line.split()
                if parts:
                    node.kernels[parts[0]] = Kernel(
                        headers=len(parts) > 1 and parts[1] == "yes", module=parts[2] if len(parts) > 2 else ""
                    )
        elif name == "dpkg":
            node.dpkg = _apt.parse_dpkg_query("\n".join(lines))
        elif name == "loaded":
            node.loaded = loaded_version("\n".join(lines))
        elif name == "nouveau":
            node.nouveau = "loaded" in lines
        elif name == "persistenced":
            # is-enabled prints nothing for a unit that is not there; static, alias and indirect need no enabling.
            node.persistenced_enabled = bool(lines) and lines[0].strip() in ENABLED_STATES
            node.persistenced_active = len(lines) > 1 and lines[1].strip() == "active"
        elif name == "smi":
            rc, _sep, fields = rest.partition(" ")
            node.smi_rc = int(rc) if rc.lstrip("-").isdigit() else None
            node.smi_fields = [f for f in fields.split(",") if f]
            node.smi_text = "\n".join(lines)
            node.smi_answers = node.smi_rc == 0
        elif name == "file":
            node.full = True
            node.files[rest] = (_b64(lines) or b"").decode("utf-8", "replace")
        elif name == "nofile":
            node.full = True
            node.files[rest] = None
        elif name == "foreign":
            node.full = True
            node.foreign = [line.strip() for line in lines if line.strip()]
        elif name == "initramfs":
            kernel, _sep, count = rest.partition(" ")
            node.initramfs_kernel = kernel
            node.initramfs_has_blacklist = None if count == "unreadable" else count.strip() not in ("", "0")
        elif name == "secureboot":
            node.secure_boot = _b64(lines)
        elif name == "mok":
            node.mok = _b64(lines)
        elif name == "moklist":
            node.moklist = _b64(lines)
        elif name == "df":
            for line in lines[1:]:
                parts = line.split()
                if len(parts) >= 6 and parts[3].isdigit():
                    node.free_mib[parts[5]] = int(parts[3])
    return node


# ---------------------------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """The role's variables the plan depends on, and the node's system from its facts."""

    state: str = "present"
    branch: str = ""
    version: str = ""
    source: str = "distribution"
    flavour: str = "proprietary"
    headless: bool = True
    extra_packages: tuple[str, ...] = ()
    persistenced: bool = True
    kernels: tuple[str, ...] = ()
    manage_repository: bool = True
    debian_mirror: str = "http://deb.debian.org/debian"
    debian_security_mirror: str = "http://deb.debian.org/debian-security"
    repository_url: str = ""
    repository_suite: str = "/"
    repository_components: tuple[str, ...] = ()
    repository_key: str = ""
    repository_key_url: str = ""
    repository_key_fingerprints: tuple[str, ...] = CUDA_KEY_FINGERPRINTS
    min_free_mib: int = 1500
    distribution: str = "Debian"
    distribution_version: str = "12"
    distribution_major: str = "12"
    codename: str = "bookworm"
    architecture: str = "x86_64"

    @property
    def writes_source(self) -> bool:
        """Ubuntu's own archive already carries its driver packages; otherwise the role writes the source."""
        return self.manage_repository and not (self.source == "distribution" and self.distribution == "Ubuntu")

    @property
    def cuda(self) -> tuple[str, str]:
        return cuda_repository(self.distribution, self.distribution_version, self.distribution_major, self.architecture)

    @property
    def repository(self) -> str:
        if self.repository_url:
            return self.repository_url
        return self.cuda[0] if self.source == "cuda" else ""

    @property
    def key_url(self) -> str:
        """Where the node fetches the key: as given, or NVIDIA's key next to its CUDA repository (source cuda with
        NVIDIA's repository and no key given)."""
        if self.source == "distribution" or not self.writes_source or self.repository_key:
            return ""
        if self.repository_key_url:
            return self.repository_key_url
        if self.source == "cuda" and not self.repository_url:
            url, key_file = self.cuda
            return url + key_file
        return ""

    def source_text(self, keyring: str = _apt.KEYRING_PLACEHOLDER) -> str:
        if not self.writes_source:
            return ""
        return apt_source(
            self.source,
            self.codename,
            self.debian_mirror,
            self.debian_security_mirror,
            self.repository,
            self.repository_suite,
            self.repository_components,
            keyring,
        )


# Where the role installs the driver: apt and dpkg on these distributions, for the architectures the driver is packaged
# for (as Ansible's facts name them).
DISTRIBUTIONS = ("Debian", "Ubuntu")
ARCHITECTURES = ("x86_64", "aarch64")


def check_platform(inputs: Inputs) -> None:
    """The node's system and architecture (from its facts) are ones the role installs the driver on."""
    if inputs.distribution in DISTRIBUTIONS and inputs.architecture in ARCHITECTURES:
        return
    raise Refusal(
        f"kubegpu.node.nvidia_driver installs the driver from apt packages on {' and '.join(DISTRIBUTIONS)}, on "
        f"{' or '.join(ARCHITECTURES)}; it runs {inputs.distribution} {inputs.distribution_version} on "
        f"{inputs.architecture}. Install the driver there with the system's own tools. {NOTHING_CHANGED}"
    )


def check_inputs(inputs: Inputs) -> None:
    """The inputs that argument specs cannot check."""
    problems = []
    if inputs.state == "present":
        if not re.fullmatch(r"\d{3,}", inputs.branch):
            problems.append(
                f'set nvidia_driver_branch to the driver branch to install (for example "535" on Debian 12, "550" on '
                f'Debian 13, "580" from NVIDIA\'s repository), not "{inputs.branch}"'
            )
        elif inputs.version and driver_branch(inputs.version) != inputs.branch:
            problems.append(f'nvidia_driver_version "{inputs.version}" is not a version of branch "{inputs.branch}"')
        if inputs.source == "mirror" and not inputs.repository_url:
            problems.append("source mirror needs nvidia_driver_repository_url")
        if inputs.source != "distribution" and inputs.writes_source:
            if not inputs.repository_key and not inputs.key_url:
                problems.append(
                    "source mirror needs the repository's signing key (nvidia_driver_repository_key, or "
                    "nvidia_driver_repository_key_url with nvidia_driver_repository_key_fingerprints)"
                )
            if inputs.key_url and not inputs.repository_key_fingerprints:
                problems.append(
                    f"a key fetched from a URL ({inputs.key_url}) is trusted only by its fingerprint: set "
                    "nvidia_driver_repository_key_fingerprints to the fingerprints it must have"
                )
    if problems:
        raise Refusal("; ".join(problems).capitalize() + f". {NOTHING_CHANGED}")


def check_key(inputs: Inputs, key: str | None, key_error: str) -> None:
    """The repository's key: fetched, and each of its keys trusted."""
    if inputs.source == "distribution" or not inputs.writes_source:
        return
    where = inputs.key_url or "nvidia_driver_repository_key"
    if key_error:
        raise Refusal(
            f"the node could not fetch the repository's signing key from {inputs.key_url} ({key_error}). Check "
            f"nvidia_driver_repository_key_url and the node's access to it. {NOTHING_CHANGED}"
        )
    if not key:
        raise Refusal(f"no signing key for the {inputs.source} source. {NOTHING_CHANGED}")
    try:
        found, untrusted = _apt.untrusted_fingerprints(key, inputs.repository_key_fingerprints)
    except _apt.OpenPGPError as exc:
        raise Refusal(f"the key from {where} is not an OpenPGP public key ({exc}). {NOTHING_CHANGED}") from None
    if untrusted and inputs.repository_key_fingerprints:
        trusted = [_apt.normalise_fingerprint(f) for f in inputs.repository_key_fingerprints]
        raise Refusal(
            f"the key from {where} has the fingerprint(s) {', '.join(found)}, and only {', '.join(trusted)} "
            f"{'is' if len(trusted) == 1 else 'are'} trusted (nvidia_driver_repository_key_fingerprints). The key "
            "was not written. If the repository's owner really changed its key, check the new fingerprint through "
            f"another channel and set it. {NOTHING_CHANGED}"
        )


@dataclass
class Source:
    """What the source check found, kept for the rest of the run: the key (armoured), {package: [versions]}."""

    key: str | None
    offered: dict[str, list[str]]


def check_offer(inputs: Inputs, found: _apt.SourceCheck) -> None:
    if found.update_error:
        where = inputs.repository or inputs.debian_mirror
        raise Refusal(
            f"apt could not read {inputs.source} source {where} with the key given (a wrong key, an unsigned or "
            f"unreachable repository): {found.update_error}. Give the key that signs it (nvidia_driver_repository_key, "
            f"or _key_url with _key_fingerprints). {NOTHING_CHANGED}"
        )


@dataclass
class Plan:
    result: dict[str, Any]
    warnings: list[str]


def _facts(inputs: Inputs, planned_names: list[str], kernels: Kernels, dkms: bool, node: NodeRead,
           decision: Decision, pci_gpus: list[dict[str, Any]], error: str) -> dict[str, Any]:  # fmt: skip
    gpus: list[dict[str, Any]] = []
    if node.smi_rc == 0 and node.smi_fields:
        try:
            gpus = smi_gpus(node.smi_text, node.smi_fields)
        except ValueError:
            gpus = []
    installed_packages = {
        name: node.dpkg[name].version for name in planned_names if name in node.dpkg and node.dpkg[name].present
    }
    return {
        "branch": inputs.branch,
        "version": inputs.version,
        "source": inputs.source,
        "flavour": inputs.flavour,
        "installed_version": decision.installed_version,
        "loaded_version": decision.loaded_version,
        "reboot_required": decision.reboot_required,
        "next_boot_ready": decision.next_boot_ready,
        "kernels": kernels.targets,
        "dkms": dkms,
        "packages": planned_names,
        "installed_packages": installed_packages,
        "error": error,
        "gpus_from": "nvidia-smi" if gpus else "pci",
        "gpu_count": len(gpus or pci_gpus),
        "gpus": gpus or [{"pci_bus_id": g["pci_bus_id"], "device_id": g["device_id"]} for g in pci_gpus],
    }


def facts_text(facts: dict[str, Any]) -> str:
    """The facts file's content, as Ansible's to_nice_json(sort_keys=true) writes it."""
    return json.dumps(facts, indent=4, sort_keys=True, separators=(",", ": "), ensure_ascii=False) + "\n"


def plan(
    inputs: Inputs,
    node: NodeRead,
    source: Source,
    files: dict[str, str | None],
    pci_gpus: list[dict[str, Any]],
    check_mode: bool = False,
    error: str = "",
    facts_now: str | None = None,
) -> Plan:
    """Everything the role does on this node, from one read of it (`node`), the source's offer (`source`), the role's
    files as they are (`files`) and the GPUs on the PCI bus.

    error: the message of a failure earlier in this run: nothing is refused then, and the plan says what is on the
    node (the facts, the holds to put back) so that the role can record it before it fails.
    facts_now: the facts file's content when the role wrote it earlier in this run (files has the one read before).
    """
    warnings: list[str] = []
    after_failure = bool(error)
    names = packages(
        inputs.branch, inputs.source, inputs.distribution, inputs.flavour, inputs.persistenced, inputs.headless
    )
    # Ubuntu's precompiled modules are signed by Canonical (they load under Secure Boot): used when every kernel has
    # them, DKMS otherwise.
    probe_kernels = choose_kernels(node.boot, node.running, inputs.kernels, node.kernels, dkms=False)
    precompiled = [
        f"linux-modules-nvidia-{name}-{k}"
        for name in [_precompiled_suffix(inputs)]
        if name
        for k in probe_kernels.targets
    ]
    dkms = not (precompiled and all(p in source.offered for p in precompiled))
    kernels = choose_kernels(node.boot, node.running, inputs.kernels, node.kernels, dkms=dkms)
    if kernels.skipped:
        warnings.append(
            f"the running kernel {', '.join(kernels.skipped)} has no headers: the nvidia module is built for "
            f"{kernels.next_boot} only, which boots next (a kernel upgraded and not rebooted yet); the driver runs "
            "after the reboot"
        )
    package_list = names["packages"]
    if not dkms:
        package_list = [p for p in package_list if p != names["kernel_package"]] + precompiled

    offered_kernel = source.offered.get(names["kernel_package"], [])
    chosen = candidate(offered_kernel, inputs.branch, inputs.version)
    if not chosen and not after_failure:
        exact = f" at version {inputs.version}" if inputs.version else ""
        versions = f" (versions: {', '.join(offered_kernel)})" if inputs.version else ""
        raise Refusal(
            f"{inputs.source} source has no {names['kernel_package']} in branch {inputs.branch}{exact} for "
            f"{inputs.distribution} {inputs.distribution_version}. Branches it has: "
            f"{', '.join(branches(offered_kernel)) or 'none'}{versions}. Set nvidia_driver_branch to one of them, or "
            f"use another source. {NOTHING_CHANGED}"
        )
    planned = pinned(
        [*names["pinning"], *package_list, *inputs.extra_packages], source.offered, inputs.branch, inputs.version
    )
    planned_names = [_apt.split_pin(p)[0] for p in planned]
    wanted = _apt.install_plan(node.dpkg, planned)
    pinning_names = set(names["pinning"])
    other_pinning = sorted(
        name
        for name, info in node.dpkg.items()
        if name.startswith(PINNING_PREFIX) and name not in pinning_names and info.present
    )
    # Each apt call gets its whole list when any of it is not in place (apt leaves alone what is): the transaction is
    # the one apt would plan for the whole set.
    pending = {_apt.split_pin(p)[0] for p in wanted["install"]}
    pinning_list = [p for p in planned if _apt.split_pin(p)[0] in pinning_names]
    package_entries = [p for p in planned if _apt.split_pin(p)[0] not in pinning_names]
    install_pinning = pinning_list if pending & pinning_names else []
    install_packages = package_entries if pending - pinning_names else []
    # A run that failed halfway (a postinst that failed: packages unpacked or half-configured) left apt with broken
    # dependencies: everything goes in one transaction that also fixes them (apt-get install --fix-broken), which
    # replaces what did not configure.
    broken = sorted(name for name, info in node.dpkg.items() if info.present and not info.installed)
    apt_state = "present"
    if broken and (install_pinning or install_packages):
        install_packages = [*pinning_list, *package_entries]
        install_pinning = []
        apt_state = "fixed"

    if not after_failure:
        missing_headers = [k for k in kernels.targets if dkms and not node.kernels.get(k, Kernel()).headers]
        if missing_headers:
            raise Refusal(
                f"DKMS cannot build the nvidia module for {', '.join(missing_headers)}: its headers are missing. "
                f"Install them (apt-get install {' '.join('linux-headers-' + k for k in missing_headers)}), or list "
                f"the kernels to build for in nvidia_driver_kernels (now {', '.join(kernels.targets)}: the kernel "
                f"that boots next, and the running one when it has headers). {NOTHING_CHANGED}"
            )

    # The kernel module of the planned version, per kernel; DKMS builds it for a target kernel that lacks it, unless
    # apt installs the module package (its postinst builds for every kernel with headers).
    planned_kernel = next((p for p in planned if _apt.split_pin(p)[0] == names["kernel_package"]), "")
    planned_upstream = upstream_version(_apt.split_pin(planned_kernel)[1]) if planned_kernel else ""
    kernel_installs = names["kernel_package"] in pending
    dkms_build = []
    if dkms and not kernel_installs and planned_upstream:
        dkms_build = [
            k
            for k in kernels.targets
            if node.kernels.get(k, Kernel()).headers and node.kernels.get(k, Kernel()).module != planned_upstream
        ]

    # The files the role writes, against what they hold now.
    want_files: list[tuple[str, str]] = []
    if inputs.writes_source and inputs.source != "distribution" and source.key:
        want_files.append((KEYRING_FILE, source.key))
    if inputs.writes_source:
        want_files.append((SOURCE_FILE, inputs.source_text(KEYRING_FILE)))
    want_files.append((PREFERENCES_FILE, preferences(inputs.branch, inputs.version)))
    want_files.append((BLACKLIST_FILE, BLACKLIST))
    file_plan = [
        {"path": path, "content": content, "mode": "0644", "changed": files.get(path) != content}
        for path, content in want_files
    ]
    written = {f["path"] for f in file_plan if f["changed"]}
    # The initramfs of the kernel that boots next (the newest in /boot) must keep nouveau out: rebuilt when the
    # blacklist is written, and when an earlier run stopped before the rebuild.
    initramfs_rebuild = bool(node.initramfs_kernel) and (
        BLACKLIST_FILE in written or node.initramfs_has_blacklist is False
    )
    if node.initramfs_has_blacklist is None and node.initramfs_kernel:
        initramfs_rebuild = False
        warnings.append(
            f"the initramfs of {node.initramfs_kernel} cannot be read (no lsinitramfs): whether it keeps nouveau out "
            "is not known"
        )
    update_lists = inputs.writes_source and bool(
        install_pinning or install_packages or written & {KEYRING_FILE, SOURCE_FILE}
    )

    # The reboot decision, for what the packages would install in check mode.
    next_kernel = node.kernels.get(kernels.next_boot, Kernel())
    running_kernel = node.kernels.get(node.running, Kernel())
    installed = next_kernel.module
    running_module = running_kernel.module
    kernel_info = node.dpkg.get(names["kernel_package"] if dkms else (precompiled[-1] if precompiled else ""))
    packaged = kernel_info.version if kernel_info is not None and kernel_info.installed else ""
    if check_mode and (install_packages or install_pinning or dkms_build):
        installed = planned_upstream or installed
        packaged = planned_upstream or packaged
        if node.running in kernels.targets:
            running_module = installed
    if not dkms:
        packaged = installed if kernel_info is not None and kernel_info.installed else ""
    decision = reboot_decision(
        installed,
        node.loaded,
        node.nouveau,
        bool(pci_gpus),
        running_module if node.running != kernels.next_boot else None,
        node.running,
        kernels.next_boot,
        packaged,
    )
    if after_failure:
        decision = Decision(
            "none",
            False,
            f"the run failed before the driver was in place: {error}",
            decision.installed_version,
            decision.loaded_version,
            decision.next_boot_ready,
        )

    # nvidia-persistenced fails to start without a GPU and a loaded driver: enabled always, started when it can run. In
    # check mode, before the packages are installed, its unit may not be there yet.
    pending_in_check = check_mode and bool(pending)
    gpus_run = bool(pci_gpus) and decision.action in ("none", "load") and decision.next_boot_ready
    persistenced = {
        "enable": inputs.persistenced and not node.persistenced_enabled,
        "start": inputs.persistenced and gpus_run and not node.persistenced_active,
    }
    persistenced["change"] = bool(
        (persistenced["enable"] or persistenced["start"]) and not pending_in_check and not after_failure
    )

    facts = _facts(inputs, planned_names, kernels, dkms, node, decision, pci_gpus, error)
    text = facts_text(facts)
    current_facts = facts_now if facts_now is not None else files.get(FACT_FILE)

    if not after_failure:
        warnings.extend(gpu_support(pci_gpus, inputs.branch, inputs.flavour))
    result = {
        "kernels": {"targets": kernels.targets, "next_boot": kernels.next_boot, "running": node.running},
        "dkms": dkms,
        "kernel_package": names["kernel_package"],
        "version": planned_upstream,
        "planned": planned,
        "changes": {
            "remove": other_pinning,
            "install_pinning": install_pinning,
            "install_packages": install_packages,
            "apt_state": apt_state,
            "broken": broken,
            "to_hold": wanted["to_hold"],
            "hold_after_apt": wanted["hold_after_apt"],
            "dkms_build": dkms_build,
            "update_lists": update_lists,
            "initramfs": initramfs_rebuild,
        },
        "update_lists_argv": _apt.update_lists_argv(SOURCE_FILE),
        "files": file_plan,
        "decision": decision.as_dict(),
        "persistenced": persistenced,
        "smi_answers": node.smi_answers,
        "gpus_on_pci": len(pci_gpus),
        "facts": facts,
        "facts_text": text,
        "facts_changed": current_facts != text,
        "fact_file": FACT_FILE,
    }
    result["steps"] = steps(result)
    return Plan(result=result, warnings=warnings)


def steps(result: dict[str, Any]) -> dict[str, bool]:
    """Which of the role's task files have anything to do (tasks/main.yml includes only those: on a node in place a
    skipped task costs the controller about what a run one does). `install`: any task of tasks/install.yml would run;
    `activate`: any of tasks/activate.yml (load, reboot or its warning, nvidia-persistenced); `facts`: the facts file
    differs."""
    changes = result["changes"]
    decision = result["decision"]
    return {
        "install": bool(
            any(f["changed"] for f in result["files"])
            or changes["initramfs"]
            or changes["remove"]
            or changes["update_lists"]
            or changes["install_pinning"]
            or changes["install_packages"]
            or changes["to_hold"]
            or changes["dkms_build"]
        ),
        "activate": bool(
            decision["action"] == "load" or decision["reboot_required"] or result["persistenced"]["change"]
        ),
        "facts": bool(result["facts_changed"]),
    }


def _precompiled_suffix(inputs: Inputs) -> str:
    if inputs.source == "distribution" and inputs.distribution == "Ubuntu":
        return f"{inputs.branch}-server" + ("-open" if inputs.flavour == "open" else "")
    return ""


def refuse_node(inputs: Inputs, node: NodeRead) -> None:
    """The refusals a full read can make before anything changes: a foreign driver, Secure Boot with modules that
    would not load, too little free space."""
    foreign = foreign_driver(node.foreign)
    if foreign:
        raise Refusal(f"{foreign} {NOTHING_CHANGED}")
    if node.free_mib and min(node.free_mib.values()) < inputs.min_free_mib:
        raise Refusal(
            f"{min(node.free_mib.values())} MiB are free under /usr or /var; the driver and its DKMS build need "
            f"{inputs.min_free_mib} MiB (nvidia_driver_min_free_mib). Free some space. {NOTHING_CHANGED}"
        )


def refuse_secure_boot(node: NodeRead, dkms: bool) -> None:
    """With Secure Boot on, the kernel loads only modules signed by a key it trusts: a DKMS build is unsigned unless
    DKMS has a signing key (DKMS generates /var/lib/dkms/mok.pub at its first build where it signs), and that key must
    have been enrolled at the console."""
    if not dkms or not secure_boot_on(node.secure_boot) or mok_enrolled(node.moklist, node.mok):
        return
    if node.mok:
        why = (
            f"it is signed with the DKMS key {DKMS_MOK}, which is not enrolled as a Machine Owner Key. Enroll it: "
            f"mokutil --import {DKMS_MOK} (package mokutil), then confirm at the console on the next boot"
        )
    else:
        why = (
            f"it is not signed by a key the firmware trusts (DKMS has no signing key {DKMS_MOK} yet). Give DKMS a "
            "signing key (mok_signing_key and mok_certificate in /etc/dkms/framework.conf; recent DKMS generates them "
            "at its first build), enroll it with mokutil --import, confirm at the console on the next boot, and run "
            "the role again"
        )
    raise Refusal(
        f"Secure Boot is on, and the nvidia module DKMS builds would not load: {why}; or use precompiled signed "
        f"modules (Ubuntu), or turn Secure Boot off. {NOTHING_CHANGED}"
    )


def absent_plan(node: NodeRead, files: dict[str, str | None]) -> dict[str, Any]:
    """What state absent removes: the packages the facts file recorded and every NVIDIA pinning package (a branch
    change may have left one), their holds, the role's files, and the blacklist from the initramfs."""
    recorded: list[str] = []
    text = files.get(FACT_FILE)
    if text:
        try:
            recorded = [str(p) for p in json.loads(text).get("packages", [])]
        except (ValueError, AttributeError):
            recorded = []
    pinning = [name for name, info in node.dpkg.items() if name.startswith(PINNING_PREFIX) and info.present]
    remove = list(dict.fromkeys([*recorded, *pinning]))
    present = [name for name in remove if name in node.dpkg and node.dpkg[name].present]
    return {
        "unhold": [name for name in present if node.dpkg[name].held],
        "remove": present,
        "files": [path for path in OWN_FILES if files.get(path) is not None],
        "source_removed": any(files.get(p) is not None for p in (SOURCE_FILE, KEYRING_FILE, PREFERENCES_FILE)),
        "initramfs": files.get(BLACKLIST_FILE) is not None and bool(node.initramfs_kernel),
        "removed_packages": bool(present),
    }


def probed_packages(inputs: Inputs, node: NodeRead) -> list[str]:
    """The packages whose versions the source check asks the source for: every package the plan may name, and
    Ubuntu's precompiled modules for each kernel that may be a target."""
    names = packages(
        inputs.branch, inputs.source, inputs.distribution, inputs.flavour, inputs.persistenced, inputs.headless
    )
    suffix = _precompiled_suffix(inputs)
    precompiled = []
    if suffix:
        kernels = choose_kernels(node.boot, node.running, inputs.kernels, node.kernels, dkms=False)
        precompiled = [f"linux-modules-nvidia-{suffix}-{k}" for k in kernels.targets]
    return list(dict.fromkeys([*names["pinning"], *names["packages"], *precompiled, *inputs.extra_packages]))


def dpkg_names(inputs: Inputs) -> list[str]:
    """The names and patterns the node read asks dpkg about: every package the plan may name, NVIDIA's pinning
    packages of any branch, Ubuntu's precompiled modules of any kernel."""
    names = ["nvidia-*", "libnvidia-*", "libcuda*", "cuda-drivers*", "firmware-nvidia-*", "linux-modules-nvidia-*"]
    return [*names, *inputs.extra_packages]

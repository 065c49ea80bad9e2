# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of kubegpu.node.gpu_health, not a public API: it can change at any time.
#
# Pure functions from what one read of a GPU node returns to a verdict per GPU and per node: healthy, degraded or
# failed, each with its reasons and the one action that would clear it. No I/O here: the action plugin reads the
# node in one command (READ_SCRIPT below) and hands its output over.
#
# Sources of the facts (read, not copied):
# - nvidia-smi's XML (`nvidia-smi -q -x`): the device DTD embedded in NVIDIA's nvidia-smi binary, nvsmi_device_v13.dtd
#   in 580.159.04 (a real H200's output: tests/unit/plugins/plugin_utils/fixtures/real/h200_580),
#   nvsmi_device_v12.dtd in 535.261.03 (Debian 12's package nvidia-smi) and 550.163.01 (Debian 13),
#   nvsmi_device_v11.dtd in 470.256.02 (Debian 11): element names, which elements may hold "N/A", and the renaming of
#   clocks_throttle_reasons (v11) to clocks_event_reasons (v12, v13); the three shapes of the ECC counters
#   (single_bit/double_bit before Ampere, sram/dram_(un)correctable, sram_uncorrectable_parity/secded on recent
#   drivers); gpu_reset_status (v12), which v13 no longer has: it writes gpu_recovery_action instead ("None" on a
#   healthy GPU).
# - NVIDIA's "Error Recovery and Response Flags" (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/): the recovery
#   action is None, Reset (terminate the GPU's processes, nvidia-smi -r), Reboot (the OS may be inconsistent), Drain
#   P2P (quiesce peer-to-peer traffic, then read the action again) or Drain and Reset (NVML_GPU_RECOVERY_ACTION_*).
# - nvidia-smi(1) of 535.261.03: volatile counts are since the driver loaded, aggregate ones lifetime; a row pending
#   remapping needs a GPU reset to take effect, "Remapping Failure Occurred" means remapping failed; pages pending
#   retirement are blacklisted at the next reboot (driver reload); HW Slowdown, HW Thermal Slowdown, HW Power Brake
#   Slowdown and SW Thermal Slowdown mean hardware trouble (temperature, external power brake, power draw); the
#   current PCIe link generation and width "may be reduced when the GPU is not in use"; nvidia-smi prints "GPU is
#   lost.  Reboot the system to recover this GPU" for a GPU it can no longer reach.
# - NVIDIA's Xid documentation (docs.nvidia.com/deploy/xid-errors/, the Xid catalog with its "Resolution Bucket"
#   actions RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT) and "Dynamic Page Retirement" (Xid 48 a double bit
#   error, Xid 63 a page retired or row remapped "reset gpu to activate", Xid 64 retirement/remapping failed).
# - NVIDIA/k8s-device-plugin internal/rm/health.go: Xids 13, 31, 43, 45 and 68 are application errors that leave the
#   device healthy; any other Xid makes the plugin mark the device unhealthy (allocatable drops below capacity).
# - The Linux kernel's sysfs PCI interface: /sys/bus/pci/devices/<address>/{vendor,class}; NVIDIA's vendor id 0x10de,
#   display controller classes 0x0300 (VGA) and 0x0302 (3D controller).

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

SCHEMA = 1

# Verdicts from best to worst; a node's verdict is the worst of its GPUs' and its own findings'. "unknown": the GPUs
# could not be read (no driver loaded, nvidia-smi missing): nothing to judge, which is not the same as healthy.
VERDICTS = ("healthy", "unknown", "degraded", "failed")
# The verdicts of GPUs that are not healthy (a node with one is marked, reported and named in the capacity wait).
UNHEALTHY = ("degraded", "failed")
# Actions from the least to the most disruptive; a verdict's action is the strongest of its findings'.
#   application: the GPU is fine, an application failed (restart it); watch: keep serving, watch for more;
#   reset: drain the GPU's work, then reset the GPU (nvidia-smi -r) or reboot; reboot: drain, then reboot the node;
#   replace: hardware service (NVIDIA's CONTACT_SUPPORT / RMA).
ACTIONS = ("none", "application", "watch", "reset", "reboot", "replace")
SEVERITIES = ("info", "degraded", "failed")

MARKER = "@@kubegpu-health"

# One read of the node, POSIX sh, no Python needed on the node. Arguments: $1 nvidia-smi, $2 kernel log file ("" for
# the journal, else dmesg), $3 the PCI devices folder, $4 most Xid lines kept, $5 the verdict's local facts file (""
# or missing: not read; else its folder's and its own owner, group and mode, and its text in base64, so that a run
# whose verdict is already there writes nothing). Each section starts with a MARKER line.
READ_SCRIPT = r"""
smi=$1 klog=$2 pci=$3 keep=$4
err=$(mktemp) || exit 1
trap 'rm -f "$err"' EXIT
printf '%s smi\n' "@@kubegpu-health"
if command -v "$smi" >/dev/null 2>&1; then
  "$smi" -q -x 2>"$err"; rc=$?
else
  echo "$smi: not found" >"$err"; rc=127
fi
printf '%s smi-stderr rc=%s\n' "@@kubegpu-health" "$rc"
cat "$err"
if [ -n "$klog" ]; then
  printf '%s kernel source=file\n' "@@kubegpu-health"
  if [ -r "$klog" ]; then grep -F 'NVRM: Xid' "$klog" | tail -n "$keep"; else echo "@@unreadable $klog"; fi
elif command -v journalctl >/dev/null 2>&1 && [ -n "$(journalctl -k -b -q -n 1 --no-pager 2>/dev/null)" ]; then
  printf '%s kernel source=journal\n' "@@kubegpu-health"
  journalctl -k -b -q --no-pager -o short-iso 2>/dev/null | grep -F 'NVRM: Xid' | tail -n "$keep"
elif dmesg >/dev/null 2>&1; then
  printf '%s kernel source=dmesg\n' "@@kubegpu-health"
  dmesg 2>/dev/null | grep -F 'NVRM: Xid' | tail -n "$keep"
else
  printf '%s kernel source=none\n' "@@kubegpu-health"
fi
printf '%s pci\n' "@@kubegpu-health"
for dev in "$pci"/*; do
  [ "$(cat "$dev/vendor" 2>/dev/null)" = 0x10de ] || continue
  class=$(cat "$dev/class" 2>/dev/null)
  case "$class" in 0x0300*|0x0302*) echo "${dev##*/} $class" ;; esac
done
if [ -n "${5:-}" ]; then
  printf '%s facts\n' "@@kubegpu-health"
  [ -d "${5%/*}" ] && stat -c 'dir %U %G %a' "${5%/*}"
  [ -f "$5" ] && stat -c 'file %U %G %a' "$5" && base64 "$5" | tr -d '\n' && echo
fi
printf '%s end\n' "@@kubegpu-health"
"""

NA = frozenset({"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]"})


class HealthReadError(ValueError):
    """The node's answer is not what READ_SCRIPT prints (cut off, or not from it)."""


# ----- the Xid catalogue ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class XidInfo:
    meaning: str
    severity: str  # info | degraded | failed
    action: str  # one of ACTIONS


# Xids a GPU node sees in practice, with NVIDIA's meaning and the action NVIDIA's catalog gives (its immediate
# "Resolution Bucket": RESTART_APP -> application, RESET_GPU -> reset, RESTART_BM -> reboot,
# CONTACT_SUPPORT -> replace).
# Any other Xid is reported as degraded with "see NVIDIA's Xid catalog" (the device plugin marks the GPU unhealthy).
XID_CATALOGUE: dict[int, XidInfo] = {
    8: XidInfo("GPU stopped processing (channel timeout)", "info", "application"),
    13: XidInfo("Graphics engine exception (usually the application)", "info", "application"),
    31: XidInfo("GPU memory page fault (usually the application)", "info", "application"),
    43: XidInfo("GPU stopped processing (the application's channel was reset)", "info", "application"),
    45: XidInfo("Preemptive cleanup after an earlier error", "info", "application"),
    48: XidInfo("Double bit ECC error (uncorrectable memory error)", "failed", "reset"),
    61: XidInfo("Internal micro-controller breakpoint/warning", "failed", "reset"),
    62: XidInfo("Internal micro-controller halt", "failed", "reset"),
    63: XidInfo(
        "ECC page retirement or row remapping recorded (takes effect at the next GPU reset)", "degraded", "reset"
    ),
    64: XidInfo("ECC page retirement or row remapping failed", "failed", "replace"),
    68: XidInfo("Video processor exception (usually the application)", "info", "application"),
    69: XidInfo("Graphics engine class error", "failed", "reset"),
    74: XidInfo("NVLink error", "failed", "reset"),
    79: XidInfo("GPU has fallen off the bus", "failed", "reboot"),
    92: XidInfo("High single-bit ECC error rate", "degraded", "watch"),
    94: XidInfo("Contained ECC error (the application was stopped; the GPU stays usable)", "degraded", "reset"),
    95: XidInfo("Uncontained ECC error", "failed", "reset"),
    109: XidInfo("Context switch timeout (usually the application)", "info", "application"),
    119: XidInfo("GSP RPC timeout", "failed", "reset"),
    120: XidInfo("GSP error", "failed", "reset"),
    140: XidInfo("Unrecovered ECC error", "failed", "reset"),
}
# Xid 154 (driver 550+) says which recovery the GPU now needs, in words: "GPU recovery action changed from 0x0 (None)
# to 0x1 (GPU Reset Required)". The last action named is the one that counts.
_XID154_ACTIONS = (
    ("node reboot", "reboot"),
    ("drain and reset", "reset"),
    ("drain p2p", "reset"),
    ("gpu reset", "reset"),
    ("none", "none"),
)

_XID_LINE = re.compile(
    r"NVRM: Xid \(PCI:(?P<domain>[0-9a-fA-F]+):(?P<bus>[0-9a-fA-F]+):(?P<device>[0-9a-fA-F]+)(?:\.[0-9a-fA-F])?\):\s*"
    r"(?P<xid>\d+)\s*,?\s*(?P<text>.*)$"
)


@dataclass
class XidEvent:
    bus_id: str  # as nvidia-smi writes it: 00000000:3B:00.0
    xid: int
    text: str


def bus_id(domain: int, bus: int, device: int, function: int = 0) -> str:
    """A PCI address as nvidia-smi writes bus ids: an 8-digit domain, upper-case hex."""
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


def normalise_bus_id(text: str) -> str:
    """Any of 0000:3b:00.0, 00000000:3B:00.0, 3b:00.0 as nvidia-smi's form; the text itself when unparsable."""
    match = re.fullmatch(
        r"\s*(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<device>[0-9a-fA-F]{1,2})"
        r"(?:\.(?P<function>[0-7]))?\s*",
        text or "",
    )
    if not match:
        return (text or "").strip()
    return bus_id(
        int(match["domain"] or "0", 16), int(match["bus"], 16), int(match["device"], 16), int(match["function"] or 0)
    )


def parse_xid_lines(text: str) -> list[XidEvent]:
    """Every ``NVRM: Xid (PCI:D:B:D): N, ...`` line of a kernel log (journal, dmesg or a file), in order."""
    events = []
    for line in (text or "").splitlines():
        match = _XID_LINE.search(line)
        if match:
            address = bus_id(int(match["domain"], 16), int(match["bus"], 16), int(match["device"], 16))
            events.append(XidEvent(address, int(match["xid"]), match["text"].strip()))
    return events


def xid_info(xid: int, text: str = "") -> XidInfo:
    if xid == 154:
        action = "reset"
        lowered = text.lower()
        after = lowered.rsplit(" to ", 1)[-1]
        for words, name in _XID154_ACTIONS:
            if words in after:
                action = name
                break
        if action == "none":
            return XidInfo("GPU recovery action changed: none needed now", "info", "none")
        return XidInfo(f"GPU recovery action changed: {action} required", "failed", action)
    known = XID_CATALOGUE.get(xid)
    if known is not None:
        return known
    return XidInfo("not in this collection's catalogue: see NVIDIA's Xid catalog", "degraded", "watch")


# ----- nvidia-smi -q -x ---------------------------------------------------------------------------------------------


@dataclass
class GpuRead:
    """What the health check reads of one GPU; None wherever nvidia-smi said N/A or left the element out."""

    bus_id: str
    index: int
    name: str = ""
    uuid: str = ""
    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None
    uncorrectable_volatile: int | None = None
    uncorrectable_aggregate: int | None = None
    sram_threshold_exceeded: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    link_gen_current: int | None = None
    link_gen_max: int | None = None
    link_width_current: int | None = None
    link_width_max: int | None = None
    slowdowns: list[str] = field(default_factory=list)  # active hardware-trouble clock event reasons
    reset_required: bool | None = None
    drain_and_reset_recommended: bool | None = None
    recovery_action: str | None = None  # gpu_recovery_action (DTD v13): None, Reset, Reboot, Drain P2P, ...


@dataclass
class SmiRead:
    driver_version: str = ""
    cuda_version: str = ""
    attached_gpus: int | None = None
    gpus: list[GpuRead] = field(default_factory=list)


def _text(element: ET.Element | None, path: str) -> str | None:
    if element is None:
        return None
    found = element.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return None if value.lower() in NA else value


def _int(element: ET.Element | None, path: str) -> int | None:
    value = _text(element, path)
    if value is None:
        return None
    match = re.match(r"^(\d+)", value)
    return int(match.group(1)) if match else None


def _yes(element: ET.Element | None, path: str) -> bool | None:
    value = _text(element, path)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("yes", "enabled", "active", "true"):
        return True
    if lowered in ("no", "disabled", "not active", "false"):
        return False
    return None


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _uncorrectable(counters: ET.Element | None) -> int | None:
    """Uncorrectable ECC errors of one timescale (<volatile> or <aggregate>), whichever of the DTD's shapes it has."""
    if counters is None:
        return None
    double_bit = counters.find("double_bit")
    if double_bit is not None:
        total = _int(double_bit, "total")
        if total is not None:
            return total
        return _sum([_int(double_bit, child.tag) for child in double_bit if child.tag != "total"])
    return _sum(
        [
            _int(counters, "sram_uncorrectable"),
            _int(counters, "sram_uncorrectable_parity"),
            _int(counters, "sram_uncorrectable_secded"),
            _int(counters, "dram_uncorrectable"),
        ]
    )


# Clock event (throttle) reasons that mean hardware trouble, by their v12 names; v11 writes clocks_throttle_reason_*.
SLOWDOWN_REASONS = {
    "hw_slowdown": "HW Slowdown (clocks cut by half or more: temperature, power brake or power draw)",
    "hw_thermal_slowdown": "HW Thermal Slowdown (the GPU is too hot)",
    "hw_power_brake_slowdown": "HW Power Brake Slowdown (external power brake asserted, e.g. by the power supply)",
    "sw_thermal_slowdown": "SW Thermal Slowdown (above the maximum operating temperature)",
}


def _slowdowns(gpu: ET.Element) -> list[str]:
    reasons = gpu.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if reasons is None:
        reasons = gpu.find("clocks_throttle_reasons")
        prefix = "clocks_throttle_reason_"
    if reasons is None:
        return []
    return [name for name in SLOWDOWN_REASONS if _yes(reasons, prefix + name)]


def _gpu(element: ET.Element, position: int) -> GpuRead:
    pci = element.find("pci")
    link = pci.find("pci_gpu_link_info") if pci is not None else None
    ecc = element.find("ecc_errors")
    retired = element.find("retired_pages")
    remapped = element.find("remapped_rows")
    reset = element.find("gpu_reset_status")
    address = element.get("id") or _text(pci, "pci_bus_id") or ""
    return GpuRead(
        bus_id=normalise_bus_id(address),
        index=_int(element, "minor_number") if _int(element, "minor_number") is not None else position,
        name=_text(element, "product_name") or "",
        uuid=_text(element, "uuid") or "",
        persistence_mode=_yes(element, "persistence_mode"),
        ecc_enabled=_yes(element, "ecc_mode/current_ecc"),
        uncorrectable_volatile=_uncorrectable(ecc.find("volatile") if ecc is not None else None),
        uncorrectable_aggregate=_uncorrectable(ecc.find("aggregate") if ecc is not None else None),
        sram_threshold_exceeded=_yes(ecc, "aggregate/sram_threshold_exceeded"),
        retired_pages_sbe=_int(retired, "multiple_single_bit_retirement/retired_count"),
        retired_pages_dbe=_int(retired, "double_bit_retirement/retired_count"),
        # pending_blacklist in older drivers, pending_retirement in newer ones; either Yes counts.
        retired_pages_pending=_any_yes(retired, "pending_blacklist", "pending_retirement"),
        remapped_rows_correctable=_int(remapped, "remapped_row_corr"),
        remapped_rows_uncorrectable=_int(remapped, "remapped_row_unc"),
        remapped_rows_pending=_yes(remapped, "remapped_row_pending"),
        remapped_rows_failure=_yes(remapped, "remapped_row_failure"),
        link_gen_current=_int(link, "pcie_gen/current_link_gen"),
        link_gen_max=_int(link, "pcie_gen/max_link_gen"),
        link_width_current=_int(link, "link_widths/current_link_width"),
        link_width_max=_int(link, "link_widths/max_link_width"),
        slowdowns=_slowdowns(element),
        reset_required=_yes(reset, "reset_required"),
        drain_and_reset_recommended=_yes(reset, "drain_and_reset_recommended"),
        recovery_action=_text(element, "gpu_recovery_action"),
    )


def _any_yes(element: ET.Element | None, *paths: str) -> bool | None:
    values = [_yes(element, path) for path in paths]
    if any(values):
        return True
    return False if any(v is False for v in values) else None


def parse_smi_xml(text: str) -> SmiRead:
    """``nvidia-smi -q -x`` as a SmiRead; raises HealthReadError when it is not nvidia-smi's XML."""
    start = (text or "").find("<nvidia_smi_log")
    if start < 0:
        raise HealthReadError("no <nvidia_smi_log> document in nvidia-smi's output")
    # The DOCTYPE names an external DTD that is never fetched; parse from the root element on.
    body = text[start:]
    end = body.rfind("</nvidia_smi_log>")
    if end < 0:
        raise HealthReadError("nvidia-smi's XML is cut off (no </nvidia_smi_log>)")
    try:
        root = ET.fromstring(body[: end + len("</nvidia_smi_log>")])
    except ET.ParseError as error:
        raise HealthReadError(f"nvidia-smi's XML does not parse: {error}") from None
    return SmiRead(
        driver_version=_text(root, "driver_version") or "",
        cuda_version=_text(root, "cuda_version") or "",
        attached_gpus=_int(root, "attached_gpus"),
        gpus=[_gpu(element, position) for position, element in enumerate(root.findall("gpu"))],
    )


_LOST = re.compile(r"(?i)gpu\s*(?P<address>[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])\s*:.*\bgpu is lost\b")


def parse_lost_gpus(text: str) -> list[str]:
    """Bus ids nvidia-smi reported as lost ("Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.
    Reboot the system to recover this GPU")."""
    return sorted({normalise_bus_id(m["address"]) for m in _LOST.finditer(text or "")})


# ----- the read as a whole ------------------------------------------------------------------------------------------


@dataclass
class NodeRead:
    smi_rc: int | None = None
    smi_output: str = ""
    smi_stderr: str = ""
    kernel_source: str = "none"  # journal | dmesg | file | none | unreadable
    kernel_log: str = ""
    pci: list[tuple[str, str]] = field(default_factory=list)  # (bus id, class)
    # The local facts file's folder and file as "OWNER GROUP MODE" (None: missing), and the file's text
    facts_dir: str | None = None
    facts_file: str | None = None
    facts_text: str | None = None


def split_read(stdout: str) -> NodeRead:
    """READ_SCRIPT's output, section by section."""
    sections: dict[str, list[str]] = {}
    heads: dict[str, str] = {}
    current = None
    for line in (stdout or "").splitlines():
        if line.startswith(MARKER + " "):
            head = line[len(MARKER) + 1 :].strip()
            current = head.split(" ", 1)[0]
            heads[current] = head
            sections.setdefault(current, [])
            continue
        if current is not None:
            sections[current].append(line)
    if "end" not in heads:
        raise HealthReadError("the node's health read was cut off (no end marker): nothing judged")
    read = NodeRead()
    read.smi_output = "\n".join(sections.get("smi", []))
    rc_match = re.search(r"rc=(\d+)", heads.get("smi-stderr", ""))
    read.smi_rc = int(rc_match.group(1)) if rc_match else None
    read.smi_stderr = "\n".join(sections.get("smi-stderr", []))
    source_match = re.search(r"source=(\w+)", heads.get("kernel", ""))
    read.kernel_source = source_match.group(1) if source_match else "none"
    kernel_lines = sections.get("kernel", [])
    if kernel_lines and kernel_lines[0].startswith("@@unreadable"):
        read.kernel_source = "unreadable"
        kernel_lines = []
    read.kernel_log = "\n".join(kernel_lines)
    for line in sections.get("pci", []):
        parts = line.split()
        if len(parts) >= 2:
            read.pci.append((normalise_bus_id(parts[0]), parts[1]))
    facts = sections.get("facts", [])
    for i, line in enumerate(facts):
        kind, _space, owner = line.partition(" ")
        if kind == "dir":
            read.facts_dir = owner
        elif kind == "file":
            read.facts_file = owner
            encoded = facts[i + 1] if i + 1 < len(facts) else ""
            try:
                read.facts_text = base64.b64decode(encoded, validate=True).decode("utf-8")
            except ValueError:
                read.facts_text = None
    return read


# The local facts file as the role writes it: root's, its folder 0755, itself 0644 (world-readable, as
# ansible_local's other facts), the verdict as JSON with sorted keys.
FACTS_DIR_OWNER = "root root 755"
FACTS_FILE_OWNER = "root root 644"


def facts_content(health: dict[str, Any]) -> str:
    """The text of nvidia_health.fact for this verdict (the one rendering the role writes and compares)."""
    return json.dumps(health, indent=4, sort_keys=True, separators=(",", ": "), ensure_ascii=False) + "\n"


def facts_current(read: NodeRead, content: str) -> bool:
    """Whether the node's facts file already holds `content`, with the owner and modes the role gives it."""
    return (read.facts_dir, read.facts_file, read.facts_text) == (FACTS_DIR_OWNER, FACTS_FILE_OWNER, content)


# ----- the verdict --------------------------------------------------------------------------------------------------


@dataclass
class Finding:
    severity: str  # info | degraded | failed
    action: str
    text: str


def _rank(values: tuple[str, ...], value: str) -> int:
    return values.index(value)


def _worst(findings: list[Finding]) -> tuple[str, str]:
    """(verdict, action) of a list of findings: the worst severity, the strongest action among the findings that
    count (an info finding changes neither)."""
    counted = [f for f in findings if f.severity != "info"]
    if not counted:
        return "healthy", "none"
    severity = max((f.severity for f in counted), key=lambda s: _rank(SEVERITIES, s))
    action = max((f.action for f in counted), key=lambda a: _rank(ACTIONS, a))
    return severity, action


def gpu_findings(gpu: GpuRead, xids: list[XidEvent], lost: bool = False) -> list[Finding]:
    """Everything worth saying about one GPU, worst first."""
    found: list[Finding] = []
    if lost:
        found.append(Finding("failed", "reboot", "nvidia-smi reports the GPU lost (fallen off the bus)"))
    if gpu.uncorrectable_volatile:
        found.append(
            Finding(
                "failed",
                "reset",
                f"{gpu.uncorrectable_volatile} uncorrectable ECC error(s) since the driver loaded (volatile)",
            )
        )
    elif gpu.uncorrectable_aggregate:
        found.append(
            Finding(
                "degraded",
                "watch",
                f"{gpu.uncorrectable_aggregate} uncorrectable ECC error(s) in the GPU's lifetime (aggregate)",
            )
        )
    if gpu.sram_threshold_exceeded:
        found.append(Finding("failed", "replace", "SRAM uncorrectable error threshold exceeded"))
    if gpu.remapped_rows_failure:
        found.append(Finding("failed", "replace", "a row remapping failed (remapped rows: failure occurred)"))
    if gpu.remapped_rows_pending:
        found.append(Finding("degraded", "reset", "rows pending remapping: a GPU reset applies them"))
    if gpu.retired_pages_pending:
        found.append(Finding("degraded", "reboot", "pages pending retirement: retired at the next driver reload"))
    if gpu.reset_required:
        found.append(Finding("failed", "reset", "the driver reports that a GPU reset is required"))
    elif gpu.drain_and_reset_recommended:
        found.append(Finding("degraded", "reset", "the driver recommends a drain and GPU reset"))
    found += _recovery_findings(gpu)
    if gpu.link_width_current is not None and gpu.link_width_max and gpu.link_width_current < gpu.link_width_max:
        found.append(
            Finding(
                "degraded",
                "reboot",
                f"PCIe link at x{gpu.link_width_current} of x{gpu.link_width_max} (if a reboot does not retrain it, "
                "reseat or replace the GPU)",
            )
        )
    for name in gpu.slowdowns:
        found.append(Finding("degraded", "watch", f"clocks cut: {SLOWDOWN_REASONS[name]}"))
    by_xid: dict[int, list[XidEvent]] = {}
    for event in xids:
        by_xid.setdefault(event.xid, []).append(event)
    for xid, events in sorted(by_xid.items()):
        info = xid_info(xid, events[-1].text)
        times = f" ({len(events)} times)" if len(events) > 1 else ""
        found.append(Finding(info.severity, info.action, f"Xid {xid}{times}: {info.meaning}"))
    if gpu.link_gen_current is not None and gpu.link_gen_max and gpu.link_gen_current < gpu.link_gen_max:
        found.append(
            Finding(
                "info",
                "none",
                f"PCIe link at gen {gpu.link_gen_current} of {gpu.link_gen_max} (normal while the GPU is idle)",
            )
        )
    if gpu.remapped_rows_uncorrectable:
        found.append(
            Finding("info", "none", f"{gpu.remapped_rows_uncorrectable} row(s) remapped after uncorrectable errors")
        )
    retired = (gpu.retired_pages_sbe or 0) + (gpu.retired_pages_dbe or 0)
    if retired:
        found.append(Finding("info", "none", f"{retired} page(s) retired"))
    if gpu.persistence_mode is False:
        found.append(
            Finding(
                "info",
                "none",
                "persistence mode disabled (volatile ECC counts reset whenever the driver unloads; run "
                "nvidia-persistenced)",
            )
        )
    return sorted(found, key=lambda f: -_rank(SEVERITIES, f.severity))


def _recovery_findings(gpu: GpuRead) -> list[Finding]:
    """What the driver's recovery action (DTD v13, as driver 580 writes it) asks for; a reset the older
    gpu_reset_status already reported is not said twice."""
    action = (gpu.recovery_action or "").strip()
    words = action.lower()
    if words in ("", "none"):
        return []
    said = f"the driver's recovery action is {action}"
    if "reboot" in words:
        return [Finding("failed", "reboot", f"{said}: reboot the node")]
    if "reset" in words:
        if gpu.reset_required:
            return []
        return [Finding("failed", "reset", f"{said}: drain the GPU's work, then reset it (nvidia-smi -r)")]
    if "drain" in words:
        return [Finding("degraded", "reset", f"{said}: stop the GPU's peer-to-peer work, then read its health again")]
    return [Finding("degraded", "watch", f"{said} (not in this collection's list: see NVIDIA's documentation)")]


def _finding_dicts(findings: list[Finding]) -> list[dict[str, str]]:
    return [{"severity": f.severity, "action": f.action, "text": f.text} for f in findings]


def verdict(read: NodeRead, ignore_xids: list[int] | None = None) -> dict[str, Any]:
    """The node's health as the local facts hold it (``ansible_local.nvidia_health``): deterministic for one state of
    the node (no timestamps), so that writing it again changes nothing."""
    ignored = {int(x) for x in ignore_xids or []}
    xids = [e for e in parse_xid_lines(read.kernel_log) if e.xid not in ignored]
    lost = set(parse_lost_gpus(read.smi_stderr + "\n" + read.smi_output))
    smi: SmiRead | None = None
    smi_error = ""
    if read.smi_output.strip():
        try:
            smi = parse_smi_xml(read.smi_output)
        except HealthReadError as error:
            smi_error = str(error)
    if smi is None:
        said = " ".join(read.smi_stderr.split())[:200]
        smi_error = smi_error or f"nvidia-smi exit {read.smi_rc}: {said or 'no output'}"
    pci = sorted({address for address, _class in read.pci})
    node_findings: list[Finding] = []
    gpus: list[dict[str, Any]] = []
    seen: set[str] = set()
    if smi is not None:
        for gpu in sorted(smi.gpus, key=lambda g: g.index):
            seen.add(gpu.bus_id)
            findings = gpu_findings(gpu, [e for e in xids if e.bus_id == gpu.bus_id], gpu.bus_id in lost)
            gpu_verdict, action = _worst(findings)
            gpus.append(
                {
                    "index": gpu.index,
                    "bus_id": gpu.bus_id,
                    "uuid": gpu.uuid,
                    "name": gpu.name,
                    "verdict": gpu_verdict,
                    "action": action,
                    "findings": _finding_dicts(findings),
                }
            )
    # GPUs on the PCI bus that the driver does not list, or that nvidia-smi reports lost.
    missing = [a for a in pci if a not in seen] if smi is not None else []
    for address in sorted(set(missing) | (lost - seen)):
        events = [e for e in xids if e.bus_id == address]
        findings = [Finding("failed", "reboot", "on the PCI bus but not seen by the driver (fallen off the bus)")]
        if address in lost:
            findings.append(Finding("failed", "reboot", "nvidia-smi reports the GPU lost"))
        findings += [f for f in gpu_findings(GpuRead(address, -1), events) if f.severity != "info" or "Xid" in f.text]
        gpu_verdict, action = _worst(findings)
        gpus.append(
            {
                "index": None,
                "bus_id": address,
                "uuid": "",
                "name": "",
                "verdict": gpu_verdict,
                "action": action,
                "findings": _finding_dicts(findings),
            }
        )
    # Xids on addresses that are neither on the bus nor known to the driver (a GPU removed since, or a bridge).
    known = {g["bus_id"] for g in gpus}
    for xid in sorted({e.xid for e in xids if e.bus_id not in known}):
        events = [e for e in xids if e.bus_id not in known and e.xid == xid]
        info = xid_info(xid, events[-1].text)
        where = ", ".join(sorted({e.bus_id for e in events}))
        node_findings.append(Finding(info.severity, info.action, f"Xid {xid} on {where}: {info.meaning}"))
    if smi is None:
        state, action = "unknown", "none"
        if pci:
            node_findings.insert(0, Finding("info", "none", f"{len(pci)} NVIDIA GPU(s) on the PCI bus; {smi_error}"))
        else:
            node_findings.insert(0, Finding("info", "none", smi_error))
        counted_verdict, counted_action = _worst(node_findings)
        if counted_verdict != "healthy":
            state, action = counted_verdict, counted_action
    else:
        gpu_findings_all = [Finding(g["verdict"], g["action"], "") for g in gpus if g["verdict"] != "healthy"]
        state, action = _worst(gpu_findings_all + node_findings)
    if read.kernel_source in ("none", "unreadable"):
        node_findings.append(Finding("info", "none", "kernel log not readable: Xid events were not checked"))
    counted: list[tuple[str, str]] = []
    for gpu in gpus:
        label = f"GPU {gpu['index']}" if gpu["index"] is not None else "GPU"
        for finding in gpu["findings"]:
            if finding["severity"] != "info":
                line = f"{label} ({gpu['bus_id']}): {finding['text']} -> {finding['action']}"
                counted.append((finding["severity"], line))
    counted += [(f.severity, f"node: {f.text} -> {f.action}") for f in node_findings if f.severity != "info"]
    # Failures first, then what is degraded; in GPU order within each.
    reasons = [line for _severity, line in sorted(counted, key=lambda c: -_rank(SEVERITIES, c[0]))]
    notes = [f.text for f in node_findings if f.severity == "info"]
    bad = [g for g in gpus if g["verdict"] in UNHEALTHY]
    return {
        "schema": SCHEMA,
        "verdict": state,
        "action": action,
        "brief": brief(state, action, bad),
        "summary": summary(state, action, gpus, reasons, notes),
        "reasons": reasons,
        "notes": notes,
        "gpus": gpus,
        "unhealthy_gpus": [g["bus_id"] for g in bad],
        "gpu_count": {"pci": len(pci), "driver": len(smi.gpus) if smi is not None else None},
        "driver_version": smi.driver_version if smi is not None else "",
        "kernel_log": read.kernel_source,
        "xids": _xid_summary(xids),
    }


def _xid_summary(xids: list[XidEvent]) -> list[dict[str, Any]]:
    counts: dict[tuple[str, int], list[XidEvent]] = {}
    for event in xids:
        counts.setdefault((event.bus_id, event.xid), []).append(event)
    out = []
    for (address, xid), events in sorted(counts.items()):
        info = xid_info(xid, events[-1].text)
        out.append(
            {
                "bus_id": address,
                "xid": xid,
                "count": len(events),
                "meaning": info.meaning,
                "action": info.action,
                "last": events[-1].text[:160],
            }
        )
    return out


def brief(state: str, action: str, bad: list[dict[str, Any]]) -> str:
    """A few words for a table cell: "healthy", "failed (reset): GPU 2", "unknown"."""
    if state not in UNHEALTHY:
        return state
    names = [f"GPU {g['index']}" if g["index"] is not None else f"GPU {g['bus_id']}" for g in bad]
    return f"{state} ({action})" + (": " + ", ".join(names) if names else "")


def summary(state: str, action: str, gpus: list[dict[str, Any]], reasons: list[str], notes: list[str]) -> str:
    """One line for the play's output, the validation table and the node's annotation."""
    if state == "unknown":
        return "unknown: " + (notes[0] if notes else "the GPUs could not be read")
    total = len(gpus)
    if state == "healthy":
        return f"healthy: {total} GPU(s)"
    bad = [g for g in gpus if g["verdict"] in UNHEALTHY]
    head = f"{state} ({action}): {len(bad)} of {total} GPU(s)" if bad else f"{state} ({action})"
    return head + ": " + "; ".join(reasons[:3]) + (f"; {len(reasons) - 3} more" if len(reasons) > 3 else "")


def judge(stdout: str, ignore_xids: list[int] | None = None) -> dict[str, Any]:
    """READ_SCRIPT's output to the verdict."""
    return verdict(split_read(stdout), ignore_xids)


def judge_and_compare(stdout: str, ignore_xids: list[int] | None = None) -> tuple[dict[str, Any], str, bool]:
    """READ_SCRIPT's output to the verdict, the facts file's text for it, and whether the node has that file already."""
    read = split_read(stdout)
    health = verdict(read, ignore_xids)
    content = facts_content(health)
    return health, content, facts_current(read, content)


# ----- what the cluster side needs ----------------------------------------------------------------------------------


# gpu_health_fail_on (the action's fail_on): the verdicts each setting fails the role for. "unknown" never fails it.
FAIL_ON = {"none": (), "degraded": UNHEALTHY, "failed": ("failed",)}


def fails(health: dict[str, Any], fail_on: str) -> bool:
    """Whether a verdict is at least as bad as fail_on (none, degraded or failed) says the role must fail for."""
    if fail_on not in FAIL_ON:
        raise ValueError(f"gpu_health_fail_on must be none, degraded or failed, not {fail_on}.")
    return health.get("verdict") in FAIL_ON[fail_on]


def verdict_rank(value: str) -> int:
    return _rank(VERDICTS, value) if value in VERDICTS else 0

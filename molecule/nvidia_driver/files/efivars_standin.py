# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Test tooling for molecule/nvidia_driver (see tests/README.md, stand-ins): writes the EFI variables a UEFI machine
# with shim exposes under /sys/firmware/efi/efivars (a tmpfs here: containers have no EFI variables), in the kernel's
# format: 4 bytes of attributes, then the value.
# Run with python3 (3.8+) on the node:
#   efivars_standin.py secure-boot on|off            SecureBoot-8be4df61-...: one byte, 1 when on
#   efivars_standin.py enroll CERT [CERT...]         MokListRT-605dab50-...: an EFI_SIGNATURE_LIST of X.509 entries
#                                                    per certificate (DER files), as shim hands enrolled MOKs to Linux
#   efivars_standin.py clear                         no EFI variables at all (a machine booted without UEFI)
from __future__ import annotations

import shutil
import struct
import sys
import uuid
from pathlib import Path

EFIVARS = Path("/sys/firmware/efi/efivars")
GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
SHIM = "605dab50-e046-4300-abb6-3dd810dd8b23"
# EFI_VARIABLE_NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS; MokListRT is volatile (BOOTSERVICE | RUNTIME).
ATTRIBUTES_NV_BS_RT = 0x7
ATTRIBUTES_BS_RT = 0x6
X509 = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072").bytes_le


def write(name: str, attributes: int, value: bytes) -> None:
    EFIVARS.mkdir(parents=True, exist_ok=True)
    (EFIVARS / name).write_bytes(struct.pack("<I", attributes) + value)


def main(argv: list[str]) -> int:
    if argv[:1] == ["secure-boot"] and argv[1:] in (["on"], ["off"]):
        write(f"SecureBoot-{GLOBAL}", ATTRIBUTES_NV_BS_RT, bytes([argv[1] == "on"]))
    elif argv[:1] == ["enroll"] and len(argv) > 1:
        lists = b""
        for cert in argv[1:]:
            entry = uuid.UUID(SHIM).bytes_le + Path(cert).read_bytes()
            lists += X509 + struct.pack("<III", 28 + len(entry), 0, len(entry)) + entry
        write(f"MokListRT-{SHIM}", ATTRIBUTES_BS_RT, lists)
    elif argv == ["clear"]:
        shutil.rmtree(EFIVARS.parent, ignore_errors=True)
    else:
        print("usage: efivars_standin.py secure-boot on|off | enroll CERT... | clear", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

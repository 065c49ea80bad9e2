# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of this collection's package roles (kubegpu.node.nvidia_driver_plan and
# kubegpu.node.nvidia_container_toolkit_plan), not a public API: it can change at any time.
#
# The one apt layer both roles share, planned on the controller:
#   - the signing key check: the fingerprints of an OpenPGP public key (RFC 9580, no gpg needed anywhere) against
#     the trusted list;
#   - the source check: one command on the node that fetches the key with apt's own downloader and reads the source
#     in a throwaway apt state (its own lists and cache: nothing of the node's apt state changes, so it also runs in
#     check mode; a signature that does not verify fails there, every failure an error), then what it offers;
#   - the dpkg read -> plan -> hold cycle: one dpkg-query, what apt and dpkg must still do;
#   - the update of the node's own lists for the role's source only, before apt installs what the plan chose, so that
#     apt and the plan see the same versions (a new point release is invisible to apt until its lists are updated);
#   - Debian version order, as dpkg --compare-versions.

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# --- Debian version order ------------------------------------------------------------------------------------------


def _order(char: str) -> int:
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's comparison of an upstream version or a revision (deb-version(7))."""
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return -1 if first_diff < 0 else 1
    return 0


def _split_version(version: str) -> tuple[int, str, str]:
    epoch = 0
    head, colon, rest = version.partition(":")
    if colon and head.isdigit():
        epoch, version = int(head), rest
    upstream, _dash, revision = version.rpartition("-") if "-" in version else (version, "", "0")
    return epoch, upstream, revision or "0"


def debian_version_compare(a: str, b: str) -> int:
    """-1, 0 or 1, as `dpkg --compare-versions a lt|eq|gt b` answers. Kernel release names order the same way
    ('6.1.0-9-amd64' before '6.1.0-28-amd64'), as Debian's linux-version sort orders them."""
    ea, ua, ra = _split_version(str(a).strip())
    eb, ub, rb = _split_version(str(b).strip())
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


class DebianVersion(str):
    """A version that sorts as dpkg orders versions: max(versions, key=DebianVersion)."""

    __slots__ = ()

    def __lt__(self, other: object) -> bool:
        return debian_version_compare(self, str(other)) < 0

    def __gt__(self, other: object) -> bool:
        return debian_version_compare(self, str(other)) > 0

    def __le__(self, other: object) -> bool:
        return debian_version_compare(self, str(other)) <= 0

    def __ge__(self, other: object) -> bool:
        return debian_version_compare(self, str(other)) >= 0


def newest(versions: Iterable[str]) -> str:
    """The newest of some versions in dpkg's order; '' when there are none. A plain str: it goes into task results,
    which Ansible stores only as its own types."""
    return str(max((DebianVersion(v) for v in versions if v), default=DebianVersion("")))


# --- dpkg: read, plan, hold ----------------------------------------------------------------------------------------

DPKG_FORMAT = "${Package}|${Version}|${Status}\n"


def dpkg_query_argv(names: Sequence[str]) -> list[str]:
    """dpkg-query for some packages (names or dpkg patterns such as 'nvidia-driver-pinning-*'). It exits 1 when one
    of them is unknown, and still lists the others."""
    return ["dpkg-query", "-W", f"-f={DPKG_FORMAT}", *names]


@dataclass(frozen=True)
class Installed:
    """One package as dpkg has it: its version ('' when dpkg knows it but it is not installed), what is wanted of it
    (install, hold, deinstall, purge) and its state (installed, config-files, half-configured, unpacked...)."""

    version: str
    want: str
    state: str

    @property
    def installed(self) -> bool:
        return self.state == "installed"

    @property
    def present(self) -> bool:
        """On the node in some form that dpkg can hold (not merely known, not only configuration files left)."""
        return bool(self.version) and self.state not in ("not-installed", "config-files")

    @property
    def held(self) -> bool:
        return self.want == "hold"


def parse_dpkg_query(text: str) -> dict[str, Installed]:
    """Lines 'PACKAGE|VERSION|STATUS' as dpkg_query_argv prints them (tabs work too). A package installed for two
    architectures is listed twice with the same fields; the last line wins."""
    result: dict[str, Installed] = {}
    for line in str(text or "").splitlines():
        parts = line.split("\t" if "\t" in line else "|")
        if len(parts) == 3 and parts[0]:
            want, _flag, state = ([*parts[2].split(), "", "", ""])[:3]
            result[parts[0]] = Installed(version=parts[1], want=want, state=state)
    return result


def split_pin(entry: str) -> tuple[str, str]:
    """'name=version' -> (name, version); 'name' -> (name, '')."""
    name, _eq, version = str(entry).partition("=")
    return name, version


def install_plan(current: dict[str, Installed], planned: Sequence[str]) -> dict[str, list[str]]:
    """What apt and dpkg must still do for the planned packages ('name=version', or a bare name that apt picks the
    version of).

    install: the planned entries apt must install: not installed (dpkg's state is not "installed": unknown,
    config-files, half-configured, unpacked...), or installed at another version. This is the apt module's own rule
    (state installed, the installed version equal to the one asked for, epoch included), so skipping apt when it is
    empty skips nothing apt would have done. A name dpkg does not list (a virtual package) is always to install.
    to_hold: the planned names that are on the node and not held yet (dpkg cannot hold what it does not have).
    hold_after_apt: every planned name, for after apt changed anything (apt releases the hold of what it changes).
    """
    install: list[str] = []
    to_hold: list[str] = []
    names: list[str] = []
    for entry in dict.fromkeys(str(item) for item in planned):
        name, version = split_pin(entry)
        names.append(name)
        info = current.get(name)
        if info is None or not info.installed or (version and info.version != version):
            install.append(entry)
        if info is not None and info.present and not info.held:
            to_hold.append(name)
    return {"install": install, "to_hold": to_hold, "hold_after_apt": list(dict.fromkeys(names))}


# --- the role's own source, and the node's lists of it ---------------------------------------------------------------


def deb822(comment: str, uris: Sequence[str], suites: Sequence[str], components: Sequence[str], signed_by: str) -> str:
    """One deb822 stanza (sources.list(5)), with a comment line first. A flat repository has suite '/' and no
    components. Never trusted=yes: apt checks every index against signed_by."""
    lines = [f"# {comment}", "Types: deb", f"URIs: {' '.join(uris)}", f"Suites: {' '.join(suites)}"]
    if components:
        lines.append(f"Components: {' '.join(components)}")
    lines.append(f"Signed-By: {signed_by}")
    return "\n".join(lines) + "\n"


def update_lists_argv(source_file: str) -> list[str]:
    """apt-get update of one source file only: the other lists stay as they are (List-Cleanup off), and every failure
    is an error (without Error-Mode=any a repository whose signature no longer verifies after an earlier good update
    only warns, and apt keeps the old index)."""
    return [
        "apt-get",
        "-q",
        "-o",
        f"Dir::Etc::SourceList={source_file}",
        "-o",
        "Dir::Etc::SourceParts=/nonexistent",
        "-o",
        "APT::Get::List-Cleanup=false",
        "-o",
        "APT::Update::Error-Mode=any",
        "update",
    ]


# --- the source check: one command on the node ---------------------------------------------------------------------

# Where the probe puts the throwaway keyring in the source it reads (the role writes the real path in its file).
KEYRING_PLACEHOLDER = "@KEYRING@"

# Environment: KEY_URL (a key to fetch with apt's own downloader, which uses apt's proxy settings), or KEY (the key's
# text), or neither (the source names its own keyring, or there is no source); PROBE=1 to read the source; SOURCE
# (deb822 with @KEYRING@ where the key goes; empty: the node's own lists, without updating them); PACKAGES.
# Output sections: @@key (base64 of the key as fetched) or @@key-error (the downloader's messages); then, with
# PROBE=1, @@update-failed (apt's messages) or @@offer (apt-cache madison of each package).
SOURCE_CHECK_SCRIPT = r"""set -u
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/parts" "$dir/lists/partial" "$dir/cache/archives/partial"
key=
if [ -n "${KEY_URL:-}" ]; then
  if ! /usr/lib/apt/apt-helper -o APT::Sandbox::User=root download-file "$KEY_URL" "$dir/key" >"$dir/log" 2>&1; then
    echo "@@key-error"; cat "$dir/log"; exit 0
  fi
  key=$dir/key
elif [ -n "${KEY:-}" ]; then
  printf '%s\n' "$KEY" >"$dir/key"; key=$dir/key
fi
if [ -n "$key" ]; then
  echo "@@key"; base64 "$key"
  if head -c 64 "$key" | grep -q -- '-----BEGIN'; then mv "$key" "$dir/key.asc"; key=$dir/key.asc
  else mv "$key" "$dir/key.gpg"; key=$dir/key.gpg; fi
fi
[ "${PROBE:-0}" = 1 ] || exit 0
if [ -n "${SOURCE:-}" ]; then
  printf '%s\n' "$SOURCE" | sed "s|@KEYRING@|$key|" >"$dir/parts/probe.sources"
  set -- -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$dir/parts" -o "Dir::State::Lists=$dir/lists" \
    -o "Dir::Cache=$dir/cache" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o APT::Sandbox::User=root \
    -o Debug::NoLocking=true
  if ! apt-get -q "$@" -o APT::Update::Error-Mode=any update >"$dir/log" 2>&1; then
    echo "@@update-failed"; cat "$dir/log"; exit 0
  fi
fi
echo "@@offer"
for package in ${PACKAGES:-}; do apt-cache "$@" madison "$package" 2>/dev/null; done
exit 0
"""


def source_check_argv(
    packages: Sequence[str],
    source: str = "",
    key: str = "",
    key_url: str = "",
    probe: bool = True,
) -> list[str]:
    """The argv of the source check (run through the connection's shell, with become)."""
    env = [
        f"KEY_URL={key_url}",
        f"KEY={'' if key_url else key}",
        f"PROBE={1 if probe else 0}",
        f"SOURCE={source}",
        f"PACKAGES={' '.join(packages)}",
    ]
    return ["env", *env, "sh", "-c", SOURCE_CHECK_SCRIPT, "source-check"]


@dataclass
class SourceCheck:
    """What the source check found: the key as fetched (armoured text; None when none was fetched or given), the
    downloader's error, whether the source was read, apt's error, and {package: [versions]} it offers."""

    key: str | None = None
    key_error: str = ""
    probed: bool = False
    update_error: str = ""
    offered: dict[str, list[str]] = field(default_factory=dict)


def sections(text: str) -> list[tuple[str, list[str]]]:
    """The '@@name rest' sections of a read script's output: [(header, lines)] in order (header without '@@')."""
    result: list[tuple[str, list[str]]] = []
    for line in str(text or "").splitlines():
        if line.startswith("@@"):
            result.append((line[2:], []))
        elif result:
            result[-1][1].append(line)
    return result


def parse_madison(lines: Iterable[str]) -> dict[str, list[str]]:
    """`apt-cache madison` lines (' name | version | url Packages') as {name: [versions]} in the order apt lists
    them (newest first)."""
    offered: dict[str, list[str]] = {}
    for line in lines:
        parts = [part.strip() for part in line.split("|")]
        if len(parts) >= 2 and parts[0] and parts[1]:
            versions = offered.setdefault(parts[0], [])
            if parts[1] not in versions:
                versions.append(parts[1])
    return offered


def apt_messages(lines: Iterable[str]) -> str:
    """apt's errors and warnings from its output, on one line (the progress lines left out)."""
    kept = [
        line.strip()
        for line in lines
        if re.match(r"^\s*(E:|W:|Err:|Err |Warning:|Error:)", line) or line.startswith("  ")
    ]
    kept = [line for line in kept if "unsandboxed" not in line]
    return (" ".join(kept) or " ".join(line.strip() for line in lines if line.strip())).rstrip(".")


def parse_source_check(stdout: str) -> SourceCheck:
    result = SourceCheck()
    for header, lines in sections(stdout):
        if header == "key":
            result.key = armoured(base64.b64decode("".join(lines)))
        elif header == "key-error":
            result.key_error = apt_messages(lines)
        elif header == "update-failed":
            result.probed = True
            result.update_error = apt_messages(lines)
        elif header == "offer":
            result.probed = True
            result.offered = parse_madison(lines)
    return result


# --- OpenPGP: the key's fingerprints, armour -------------------------------------------------------------------------

_PUBLIC_KEY_TAG = 6
_ARMOUR_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"


class OpenPGPError(ValueError):
    """The data is not an OpenPGP public key this check understands."""


def dearmour(text: str) -> bytes:
    """The binary packets of an ASCII-armoured key (RFC 9580 section 6)."""
    lines = text.strip().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == _ARMOUR_BEGIN)
    except StopIteration:
        raise OpenPGPError("no 'BEGIN PGP PUBLIC KEY BLOCK' in the key") from None
    body: list[str] = []
    in_headers = True
    for line in lines[start + 1 :]:
        line = line.strip()
        if line.startswith("-----END"):
            break
        if in_headers:
            if not line:
                in_headers = False
            elif ":" not in line:
                in_headers = False
                body.append(line)
            continue
        if line.startswith("="):  # the CRC24 line
            continue
        body.append(line)
    try:
        return base64.b64decode("".join(body), validate=True)
    except ValueError as exc:
        raise OpenPGPError(f"the key's base64 is damaged ({exc})") from None


def _crc24(data: bytes) -> int:
    crc = 0xB704CE
    for byte in data:
        crc ^= byte << 16
        for _bit in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def armoured(data: bytes) -> str:
    """The key as ASCII armour: an armoured key as it was, a binary one armoured (apt reads .asc keyrings)."""
    text = data.decode("ascii", "replace")
    if _ARMOUR_BEGIN in text:
        return text if text.endswith("\n") else text + "\n"
    encoded = base64.b64encode(data).decode("ascii")
    body = "\n".join(encoded[i : i + 64] for i in range(0, len(encoded), 64))
    checksum = base64.b64encode(_crc24(data).to_bytes(3, "big")).decode("ascii")
    return f"{_ARMOUR_BEGIN}\n\n{body}\n={checksum}\n-----END PGP PUBLIC KEY BLOCK-----\n"


def _packets(data: bytes):
    """(tag, body) of each OpenPGP packet (RFC 9580 section 4.2)."""
    i = 0
    while i < len(data):
        header = data[i]
        if not header & 0x80:
            raise OpenPGPError(f"not an OpenPGP packet at byte {i}")
        if header & 0x40:  # new format
            tag = header & 0x3F
            first = data[i + 1]
            if first < 192:
                length, i = first, i + 2
            elif first < 224:
                length, i = ((first - 192) << 8) + data[i + 2] + 192, i + 3
            elif first == 255:
                length, i = int.from_bytes(data[i + 2 : i + 6], "big"), i + 6
            else:
                raise OpenPGPError("partial body lengths do not occur in keys")
        else:  # old format
            tag = (header >> 2) & 0x0F
            length_type = header & 0x03
            if length_type == 3:
                length, i = len(data) - i - 1, i + 1
            else:
                size = (1, 2, 4)[length_type]
                length, i = int.from_bytes(data[i + 1 : i + 1 + size], "big"), i + 1 + size
        if i + length > len(data):
            raise OpenPGPError("the key is truncated")
        yield tag, data[i : i + length]
        i += length


def openpgp_fingerprints(key: str | bytes) -> list[str]:
    """The fingerprints of the primary keys (not subkeys) in a public key, armoured or binary: upper-case hex, in
    order (v4: SHA-1; v5 and v6: SHA-256)."""
    if isinstance(key, str):
        data = dearmour(key)
    elif isinstance(key, bytes):
        data = dearmour(key.decode("ascii", "replace")) if _ARMOUR_BEGIN.encode() in key else key
    else:
        raise OpenPGPError(f"expected the key's text, not {type(key).__name__}")
    result = []
    for tag, body in _packets(data):
        if tag != _PUBLIC_KEY_TAG or not body:
            continue
        version = body[0]
        if version == 4:
            digest = hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body, usedforsecurity=False)
        elif version == 5:
            digest = hashlib.sha256(b"\x9a" + len(body).to_bytes(4, "big") + body)
        elif version == 6:
            digest = hashlib.sha256(b"\x9b" + len(body).to_bytes(4, "big") + body)
        else:
            raise OpenPGPError(f"key version {version} is not supported")
        result.append(digest.hexdigest().upper())
    if not result:
        raise OpenPGPError("the data holds no public key")
    return result


def normalise_fingerprint(fingerprint: str) -> str:
    """'EB69 3B30 ...' or 'eb693b30...' -> 'EB693B30...'."""
    return re.sub(r"\s+", "", str(fingerprint)).upper()


def untrusted_fingerprints(key: str, trusted: Sequence[str]) -> tuple[list[str], list[str]]:
    """(every primary key fingerprint in the key, those not in the trusted list). A keyring that holds a key beyond
    the trusted ones would let that key sign the repository too, so each must be trusted."""
    found = openpgp_fingerprints(key)
    allowed = {normalise_fingerprint(f) for f in trusted}
    return found, [f for f in found if f not in allowed]

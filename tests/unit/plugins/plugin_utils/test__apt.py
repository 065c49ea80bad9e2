# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The shared apt layer of the driver and toolkit roles (plugins/plugin_utils/_apt.py), each piece tested once.

The source check runs its real script against real apt and a repository signed by tests/aptrepo (the CUDA
repository stand-in, served as file:// URLs): apt's own signature check, apt's own downloader for the key.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _apt

CUDA_PATH = "compute/cuda/repos/debian12/x86_64"

# --- Debian version order --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "result"),
    [
        ("1.18.2-1", "1.18.2-1", 0),
        ("1.18.10-1", "1.18.2-1", 1),
        ("1.19.0~rc.1-1", "1.18.2-1", 1),
        ("1.19.0~rc.1-1", "1.19.0-1", -1),
        ("1:1.0-1", "2.0-1", 1),
        ("1.0-1", "1.0-1+deb12u1", -1),
        ("1.0a", "1.0", 1),
        ("535.54.03", "535.261.03", -1),  # as numbers, not as text ("54" > "261" as text)
        ("570.195.03", "570.86.10", 1),
        ("6.1.0-9-amd64", "6.1.0-28-amd64", -1),
        ("6.1.0-28-amd64", "6.12.48+deb13-amd64", -1),
    ],
)
def test_debian_version_order(a: str, b: str, result: int):
    assert _apt.debian_version_compare(a, b) == result
    if shutil.which("dpkg"):
        op = {0: "eq", 1: "gt", -1: "lt"}[result]
        assert subprocess.run(["dpkg", "--compare-versions", a, op, b], check=False).returncode == 0


def test_newest_in_dpkg_order():
    assert _apt.newest(["580.82.07-1", "580.95.05-1", "580.9.1-1"]) == "580.95.05-1"
    assert _apt.newest([]) == ""


# --- dpkg: read, plan, hold -----------------------------------------------------------------------------------------

CUDA_PLANNED = [
    "nvidia-driver-pinning-580=580.95.05-1",
    "nvidia-driver-cuda=580.95.05-1",
    "nvidia-kernel-dkms=580.95.05-1",
    "nvidia-persistenced=580.95.05-1",
]
CUDA_NAMES = [p.split("=", maxsplit=1)[0] for p in CUDA_PLANNED]
CUDA_CONVERGED = "".join(f"{name}|580.95.05-1|hold ok installed\n" for name in sorted(CUDA_NAMES))


def plan(text: str, planned: list[str]) -> dict[str, list[str]]:
    return _apt.install_plan(_apt.parse_dpkg_query(text), planned)


def test_a_node_without_the_driver_installs_everything_and_holds_nothing_yet():
    # dpkg-query prints nothing on stdout (rc 1, "no packages found matching" on stderr); dpkg cannot hold what it
    # does not have: the holds come after apt (hold_after_apt).
    assert plan("", CUDA_PLANNED) == {"install": CUDA_PLANNED, "to_hold": [], "hold_after_apt": CUDA_NAMES}


def test_a_converged_node_needs_neither_apt_nor_dpkg():
    result = plan(CUDA_CONVERGED, CUDA_PLANNED)
    assert (result["install"], result["to_hold"]) == ([], [])


def test_installed_but_not_held_needs_only_the_holds():
    released = CUDA_CONVERGED.replace("nvidia-kernel-dkms|580.95.05-1|hold", "nvidia-kernel-dkms|580.95.05-1|install")
    result = plan(released, CUDA_PLANNED)
    assert (result["install"], result["to_hold"]) == ([], ["nvidia-kernel-dkms"])


def test_another_version_is_installed_again_at_the_planned_one():
    older = CUDA_CONVERGED.replace("nvidia-driver-cuda|580.95.05-1", "nvidia-driver-cuda|580.82.07-1")
    assert plan(older, CUDA_PLANNED)["install"] == ["nvidia-driver-cuda=580.95.05-1"]


@pytest.mark.parametrize(
    ("status", "held"),
    [
        ("deinstall ok config-files", False),  # removed, its configuration files left: nothing to hold
        ("install reinstreq half-installed", True),  # an installation that failed half way
        ("install ok unpacked", True),  # unpacked, not configured
        ("install ok half-configured", True),  # a postinst that failed (a DKMS build)
    ],
)
def test_a_package_not_fully_installed_is_installed_again_and_held(status: str, held: bool):
    result = plan(f"nvidia-kernel-dkms|580.95.05-1|{status}\n", ["nvidia-kernel-dkms=580.95.05-1"])
    assert result["install"] == ["nvidia-kernel-dkms=580.95.05-1"]
    assert result["to_hold"] == (["nvidia-kernel-dkms"] if held else [])


def test_known_but_not_installed_is_installed_and_not_held():
    result = plan("nvidia-kernel-dkms||unknown ok not-installed\n", ["nvidia-kernel-dkms=580.95.05-1"])
    assert (result["install"], result["to_hold"]) == (["nvidia-kernel-dkms=580.95.05-1"], [])


def test_a_package_marked_for_removal_but_installed_is_in_place():
    # apt's test is dpkg's current state, not the selection: "deinstall ok installed" is installed.
    result = plan("libcuda1|580.95.05-1|deinstall ok installed\n", ["libcuda1=580.95.05-1"])
    assert (result["install"], result["to_hold"]) == ([], ["libcuda1"])


def test_epochs_are_part_of_the_version():
    text = "libnvidia-compute|1:580.95.05-1|hold ok installed\n"
    assert plan(text, ["libnvidia-compute=1:580.95.05-1"])["install"] == []
    assert plan(text, ["libnvidia-compute=580.95.05-1"])["install"] == ["libnvidia-compute=580.95.05-1"]


def test_a_bare_name_needs_only_to_be_installed():
    assert plan("nvidia-persistenced|535.171.04-1|hold ok installed\n", ["nvidia-persistenced"])["install"] == []
    assert plan("", ["nvidia-persistenced"])["install"] == ["nvidia-persistenced"]


def test_tabs_work_too():
    assert _apt.parse_dpkg_query("a\t1.0-1\thold ok installed\n")["a"] == _apt.Installed("1.0-1", "hold", "installed")


@pytest.mark.skipif(not shutil.which("dpkg-query"), reason="needs dpkg-query")
def test_real_dpkg_query_output():
    said = subprocess.run(
        _apt.dpkg_query_argv(["dpkg", "no-such-package-kubegpu"]), capture_output=True, text=True, check=False
    )
    assert said.returncode == 1  # one unknown: still lists the other
    found = _apt.parse_dpkg_query(said.stdout)
    assert found["dpkg"].installed and found["dpkg"].version
    assert "no-such-package-kubegpu" not in found


# --- the role's source -----------------------------------------------------------------------------------------------


def test_deb822_is_signed_and_never_trusted():
    text = _apt.deb822("Written by a test.", ["https://example.test/repo/"], ["/"], [], "/etc/apt/keyrings/x.asc")
    assert text == (
        "# Written by a test.\nTypes: deb\nURIs: https://example.test/repo/\nSuites: /\n"
        "Signed-By: /etc/apt/keyrings/x.asc\n"
    )
    assert "Components: main contrib" in _apt.deb822("c", ["u"], ["s"], ["main", "contrib"], "k")


def test_update_of_one_source_only_keeps_the_other_lists_and_fails_on_any_error():
    argv = _apt.update_lists_argv("/etc/apt/sources.list.d/x.sources")
    assert argv[0] == "apt-get" and argv[-1] == "update"
    assert "Dir::Etc::SourceList=/etc/apt/sources.list.d/x.sources" in argv
    assert "Dir::Etc::SourceParts=/nonexistent" in argv
    assert "APT::Get::List-Cleanup=false" in argv
    assert "APT::Update::Error-Mode=any" in argv


# --- OpenPGP ---------------------------------------------------------------------------------------------------------


def _gpg_key(tmp_path: Path, algo: str) -> tuple[str, str, bytes]:
    home = tmp_path / f"g-{algo}"
    home.mkdir(mode=0o700)
    base = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    subprocess.run(
        [*base, "--quick-generate-key", "t <t@test.invalid>", algo, "sign", "never"], check=True, capture_output=True
    )
    listing = subprocess.run([*base, "--with-colons", "--list-keys"], check=True, capture_output=True, text=True).stdout
    expected = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    armoured = subprocess.run([*base, "--armor", "--export"], check=True, capture_output=True, text=True).stdout
    binary = subprocess.run([*base, "--export"], check=True, capture_output=True).stdout
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], check=False)
    return expected, armoured, binary


@pytest.mark.skipif(not shutil.which("gpg"), reason="needs gpg to make a key")
@pytest.mark.parametrize("algo", ["ed25519", "rsa2048"])
def test_fingerprint_matches_gpg(tmp_path: Path, algo: str):
    expected, armoured, binary = _gpg_key(tmp_path, algo)
    # The primary key only: gpg adds an encryption subkey for RSA, which is not listed.
    assert _apt.openpgp_fingerprints(armoured) == [expected]
    assert _apt.openpgp_fingerprints(binary) == [expected]
    # A binary key (a .gpg keyring) is armoured for the role's .asc keyring, and gpg reads it back the same.
    text = _apt.armoured(binary)
    assert text.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----\n") and _apt.openpgp_fingerprints(text) == [expected]
    home = tmp_path / "check"
    home.mkdir(mode=0o700)
    shown = subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--with-colons", "--show-keys"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], check=False)
    assert f"fpr:::::::::{expected}:" in shown
    # An armoured key is kept as it was.
    assert _apt.armoured(armoured.encode()) == armoured


def test_not_a_key_is_an_error():
    with pytest.raises(_apt.OpenPGPError, match="no 'BEGIN PGP PUBLIC KEY BLOCK'"):
        _apt.openpgp_fingerprints("<html>404</html>")
    with pytest.raises(_apt.OpenPGPError, match="damaged"):
        _apt.openpgp_fingerprints(
            "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n!!!notbase64\n-----END PGP PUBLIC KEY BLOCK-----\n"
        )


@pytest.mark.skipif(not shutil.which("gpg"), reason="needs gpg to make a key")
def test_every_key_in_the_file_must_be_trusted(tmp_path: Path):
    first, armoured, _binary = _gpg_key(tmp_path, "ed25519")
    second, _armoured, binary_second = _gpg_key(tmp_path, "rsa2048")
    both = _apt.dearmour(armoured) + binary_second
    spaced = " ".join(first[i : i + 4] for i in range(0, len(first), 4)).lower()
    assert _apt.untrusted_fingerprints(armoured, [spaced]) == ([first], [])
    assert _apt.untrusted_fingerprints(_apt.armoured(both), [first]) == ([first, second], [second])


# --- the source check against real apt --------------------------------------------------------------------------------

needs_apt = pytest.mark.skipif(
    not (shutil.which("apt-get") and Path("/usr/lib/apt/apt-helper").exists() and shutil.which("apt-ftparchive")),
    reason="needs apt, apt-helper and apt-ftparchive",
)


def check(packages: list[str], **kwargs) -> _apt.SourceCheck:
    said = subprocess.run(_apt.source_check_argv(packages, **kwargs), capture_output=True, text=True, check=False)
    assert said.returncode == 0, said.stderr
    return _apt.parse_source_check(said.stdout)


def source(url: str) -> str:
    return _apt.deb822("probe", [url], ["/"], [], _apt.KEYRING_PLACEHOLDER)


@needs_apt
def test_the_key_from_its_url_reads_the_signed_source(cuda_repo):
    root, keys = cuda_repo
    url = f"file://{root}/good/{CUDA_PATH}/"
    found = check(["nvidia-kernel-dkms", "nvidia-driver-pinning-580"], source=source(url), key_url=url + "3bf863cc.pub")
    assert found.key == (root / "good.asc").read_text()
    assert _apt.openpgp_fingerprints(found.key) == [keys["good"]]
    assert (found.key_error, found.update_error, found.probed) == ("", "", True)
    assert found.offered == {
        "nvidia-kernel-dkms": ["590.44.01-1", "580.95.05-1", "580.82.07-1", "575.64.05-1"],
        "nvidia-driver-pinning-580": ["580.95.05-1"],
    }


@needs_apt
def test_a_source_signed_with_another_key_fails_in_apt(cuda_repo):
    root, keys = cuda_repo
    found = check(
        ["nvidia-kernel-dkms"],
        source=source(f"file://{root}/wrong-key/{CUDA_PATH}/"),
        key=(root / "good.asc").read_text(),
    )
    assert found.offered == {}
    assert "NO_PUBKEY" in found.update_error and keys["wrong"][-16:] in found.update_error


@needs_apt
def test_a_key_url_that_does_not_answer_is_a_key_error(cuda_repo):
    root, _keys = cuda_repo
    found = check(["nvidia-kernel-dkms"], source=source(f"file://{root}/good/"), key_url=f"file://{root}/nothing.pub")
    assert found.key is None and found.key_error and not found.probed


@needs_apt
def test_without_probe_only_the_key_is_fetched(cuda_repo):
    root, _keys = cuda_repo
    found = check(["x"], key_url=f"file://{root}/good/{CUDA_PATH}/3bf863cc.pub", probe=False)
    assert found.key and not found.probed and found.offered == {}


@needs_apt
def test_a_point_release_published_later_is_seen_by_the_next_check(cuda_repo):
    root, _keys = cuda_repo
    key = (root / "good.asc").read_text()
    before = check(["nvidia-kernel-dkms"], source=source(f"file://{root}/good/{CUDA_PATH}/"), key=key)
    after = check(["nvidia-kernel-dkms"], source=source(f"file://{root}/good/later/{CUDA_PATH}/"), key=key)
    assert "580.105.08-1" not in before.offered["nvidia-kernel-dkms"]
    assert "580.105.08-1" in after.offered["nvidia-kernel-dkms"]


@needs_apt
def test_no_source_reads_the_nodes_own_lists_without_updating_them():
    # This machine's own lists: dpkg is in every Debian archive. Nothing is updated (no network).
    found = check(["dpkg"], source="")
    assert found.probed and found.offered.get("dpkg")


def test_sections_and_madison():
    out = "noise\n@@key\nYWJj\n@@offer\n nvidia-smi | 535.261.03-1 | http://x bookworm/non-free amd64 Packages\n"
    assert _apt.sections(out) == [
        ("key", ["YWJj"]),
        ("offer", [" nvidia-smi | 535.261.03-1 | http://x bookworm/non-free amd64 Packages"]),
    ]
    assert _apt.parse_madison([" a | 1-1 | u", " a | 2-1 | u", " a | 1-1 | v", "junk"]) == {"a": ["1-1", "2-1"]}

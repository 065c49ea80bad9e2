# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
from ansible.errors import AnsibleFilterError
from ansible_collections.kubegpu.node.plugins.filter.nvidia_container_toolkit import (
    FilterModule,
    debian_version_compare,
    openpgp_fingerprints,
    toolkit_package_plan,
    toolkit_runtime_config,
)

PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]
# The stand-in package's default, shaped as NVIDIA's generated config.toml (tests/aptrepo).
CONFIG = (Path(__file__).parents[3] / "aptrepo/files/nvidia-container-toolkit/config.toml").read_text(encoding="utf-8")


def dpkg(versions: dict[str, str], held: tuple[str, ...] = ()) -> str:
    """dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n' as it prints installed packages."""
    return "".join(
        f"{name}\t{version}\t{'hold' if name in held else 'install'} ok installed\n"
        for name, version in versions.items()
    )


def test_registered():
    assert set(FilterModule().filters()) == {"openpgp_fingerprints", "toolkit_package_plan", "toolkit_runtime_config"}


# --- fingerprints -------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not shutil.which("gpg"), reason="needs gpg to make a key")
@pytest.mark.parametrize("algo", ["ed25519", "rsa2048"])
def test_fingerprint_matches_gpg(tmp_path: Path, algo: str):
    home = tmp_path / "g"
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
    # The primary key only: gpg adds an encryption subkey for RSA, which is not listed.
    assert openpgp_fingerprints(armoured) == [expected]
    assert openpgp_fingerprints(binary) == [expected]


def test_not_a_key_is_an_error():
    with pytest.raises(AnsibleFilterError, match="no 'BEGIN PGP PUBLIC KEY BLOCK'"):
        openpgp_fingerprints("<html>404</html>")
    with pytest.raises(AnsibleFilterError, match="damaged"):
        openpgp_fingerprints(
            "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n!!!notbase64\n-----END PGP PUBLIC KEY BLOCK-----\n"
        )


# --- versions and the package plan --------------------------------------------------------------------------------


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
    ],
)
def test_debian_version_order(a: str, b: str, result: int):
    assert debian_version_compare(a, b) == result
    if shutil.which("dpkg"):
        op = {0: "eq", 1: "gt", -1: "lt"}[result]
        assert subprocess.run(["dpkg", "--compare-versions", a, op, b], check=False).returncode == 0


def test_fresh_node_installs_all_four_and_holds_them():
    plan = toolkit_package_plan("", PACKAGES, "1.18.2-1")
    assert plan["direction"] == "install"
    assert plan["install"] == [f"{name}=1.18.2-1" for name in PACKAGES]
    assert plan["to_hold"] == PACKAGES
    assert plan["problem"] == ""


def test_nothing_to_do_when_all_four_are_pinned_and_held():
    plan = toolkit_package_plan(dpkg(dict.fromkeys(PACKAGES, "1.18.2-1"), tuple(PACKAGES)), PACKAGES, "1.18.2-1")
    assert (plan["change"], plan["install"], plan["to_hold"], plan["direction"]) == ([], [], [], "none")


def test_one_package_off_moves_all_four_together():
    versions = dict.fromkeys(PACKAGES, "1.17.8-1") | {"libnvidia-container1": "1.18.2-1"}
    plan = toolkit_package_plan(dpkg(versions, tuple(PACKAGES)), PACKAGES, "1.18.2-1")
    assert plan["change"] == PACKAGES[:3]
    assert plan["install"] == [f"{name}=1.18.2-1" for name in PACKAGES]
    assert plan["direction"] == "upgrade"


def test_downgrade_is_a_problem_unless_allowed():
    current = dpkg(dict.fromkeys(PACKAGES, "1.18.2-1"))
    refused = toolkit_package_plan(current, PACKAGES, "1.17.8-1")
    assert refused["direction"] == "downgrade"
    assert "nvidia_container_toolkit_allow_downgrade" in refused["problem"]
    assert toolkit_package_plan(current, PACKAGES, "1.17.8-1", allow_downgrade=True)["problem"] == ""


def test_half_installed_and_config_files_are_not_installed():
    text = (
        "nvidia-container-toolkit\t1.18.2-1\tinstall ok half-configured\n"
        "libnvidia-container1\t1.17.8-1\tdeinstall ok config-files\n"
    )
    plan = toolkit_package_plan(text, PACKAGES, "1.18.2-1")
    assert plan["installed"] == {}
    assert plan["change"] == PACKAGES


def test_known_but_not_installed_has_no_version():
    text = "nvidia-container-toolkit||deinstall ok not-installed\nlibnvidia-container1|1.18.2-1|install ok installed\n"
    plan = toolkit_package_plan(text, PACKAGES, "1.18.2-1", "absent")
    assert plan["installed"] == {"libnvidia-container1": "1.18.2-1"}
    assert plan["to_remove"] == ["libnvidia-container1"]


def test_absent_releases_holds_and_removes():
    plan = toolkit_package_plan(
        dpkg(dict.fromkeys(PACKAGES, "1.18.2-1"), ("libnvidia-container1",)), PACKAGES, "x", "absent"
    )
    assert plan["to_unhold"] == ["libnvidia-container1"]
    assert plan["to_remove"] == sorted(PACKAGES)
    assert plan["install"] == []


def test_unknown_state_is_an_error():
    with pytest.raises(AnsibleFilterError, match="present or absent"):
        toolkit_package_plan("", PACKAGES, "1", "latest")


# --- config.toml --------------------------------------------------------------------------------------------------

SECURITY = {
    "accept-nvidia-visible-devices-envvar-when-unprivileged": False,
    "accept-nvidia-visible-devices-as-volume-mounts": True,
}


def test_commented_defaults_become_active_lines_in_place():
    result = toolkit_runtime_config(CONFIG, SECURITY)
    assert result["problem"] == ""
    assert sorted(result["changed"]) == sorted(SECURITY)
    lines = result["content"].splitlines()
    assert lines[0] == "accept-nvidia-visible-devices-as-volume-mounts = true"
    assert lines[1] == "accept-nvidia-visible-devices-envvar-when-unprivileged = false"
    # Everything else, comments included, is as it was.
    assert lines[2:] == CONFIG.splitlines()[2:]


def test_second_application_changes_nothing():
    once = toolkit_runtime_config(CONFIG, SECURITY)["content"]
    again = toolkit_runtime_config(once, SECURITY)
    assert again == {"content": once, "changed": [], "problem": ""}


def test_active_keys_in_tables_are_replaced_and_new_keys_added_to_their_table():
    result = toolkit_runtime_config(
        CONFIG, {"nvidia-container-runtime": {"log-level": "debug", "new-key": ["a", "b"]}, "extra": {"x": 1}}
    )
    doc = tomllib.loads(result["content"])
    assert doc["nvidia-container-runtime"]["log-level"] == "debug"
    assert doc["nvidia-container-runtime"]["new-key"] == ["a", "b"]
    assert doc["extra"] == {"x": 1}
    assert doc["nvidia-container-runtime"]["modes"]["cdi"]["default-kind"] == "nvidia.com/gpu"
    block = result["content"].split("[nvidia-container-runtime]\n", 1)[1].split("\n\n", 1)[0]
    assert 'new-key = ["a", "b"]' in block


def test_strings_are_escaped():
    result = toolkit_runtime_config("", {"nvidia-container-cli": {"debug": 'C:\\log "x"'}})
    assert tomllib.loads(result["content"])["nvidia-container-cli"]["debug"] == 'C:\\log "x"'


def test_invalid_toml_is_a_problem_and_left_alone():
    result = toolkit_runtime_config("a = = 1\n", SECURITY)
    assert result["content"] == "a = = 1\n"
    assert "not valid TOML" in result["problem"]


def test_settings_must_be_a_dict():
    with pytest.raises(AnsibleFilterError, match="must be a dict"):
        toolkit_runtime_config(CONFIG, ["x"])

# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
from ansible_collections.kubegpu.node.plugins.plugin_utils import _apt
from ansible_collections.kubegpu.node.plugins.plugin_utils import _nvidia_container_toolkit as tk
from ansible_collections.kubegpu.node.plugins.plugin_utils import _service_config as sc

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


def toolkit_package_plan(text: str, packages, version: str, state: str = "present", allow_downgrade: bool = False):
    return tk.package_plan(_apt.parse_dpkg_query(text), version, state, allow_downgrade, packages)


def test_fresh_node_installs_all_four_and_holds_them():
    plan = toolkit_package_plan("", PACKAGES, "1.18.2-1")
    assert plan["direction"] == "install"
    assert plan["install"] == [f"{name}=1.18.2-1" for name in PACKAGES]
    # dpkg cannot hold what it does not have: the role holds all four after apt installed them.
    assert plan["to_hold"] == []
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
    with pytest.raises(ValueError, match="present or absent"):
        toolkit_package_plan("", PACKAGES, "1", "latest")


# --- config.toml --------------------------------------------------------------------------------------------------

SECURITY = {
    "accept-nvidia-visible-devices-envvar-when-unprivileged": False,
    "accept-nvidia-visible-devices-as-volume-mounts": True,
}


def test_commented_defaults_become_active_lines_in_place():
    result = tk.runtime_config(CONFIG, SECURITY)
    assert result["problem"] == ""
    assert sorted(result["changed"]) == sorted(SECURITY)
    lines = result["content"].splitlines()
    assert lines[0] == "accept-nvidia-visible-devices-as-volume-mounts = true"
    assert lines[1] == "accept-nvidia-visible-devices-envvar-when-unprivileged = false"
    # Everything else, comments included, is as it was.
    assert lines[2:] == CONFIG.splitlines()[2:]


def test_second_application_changes_nothing():
    once = tk.runtime_config(CONFIG, SECURITY)["content"]
    again = tk.runtime_config(once, SECURITY)
    assert again == {"content": once, "changed": [], "problem": ""}


def test_active_keys_in_tables_are_replaced_and_new_keys_added_to_their_table():
    result = tk.runtime_config(
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
    result = tk.runtime_config("", {"nvidia-container-cli": {"debug": 'C:\\log "x"'}})
    assert tomllib.loads(result["content"])["nvidia-container-cli"]["debug"] == 'C:\\log "x"'


def test_invalid_toml_is_a_problem_and_left_alone():
    result = tk.runtime_config("a = = 1\n", SECURITY)
    assert result["content"] == "a = = 1\n"
    assert "not valid TOML" in result["problem"]


def test_settings_must_be_a_dict():
    with pytest.raises(ValueError, match="must be a dict"):
        tk.runtime_config(CONFIG, ["x"])


# --- the plan over one read of the node ------------------------------------------------------------------------------

INPUTS = tk.Inputs(repo_url="http://repo/libnvidia-container", runtime_config={"a": True})
KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nxx\n-----END PGP PUBLIC KEY BLOCK-----\n"


def read(
    dpkg_text: str = "", config: str | None = "a = true\n", udev: str | None = tk.UDEV_RULE, **extra
) -> tk.NodeRead:
    node = tk.NodeRead(dpkg=_apt.parse_dpkg_query(dpkg_text))
    node.files = {tk.RUNTIME_CONFIG_FILE: config, tk.UDEV_RULE_FILE: udev}
    node.modes = {path: "0644" for path, text in node.files.items() if text is not None}
    for key, value in extra.items():
        setattr(node, key, value)
    return node


def in_place(inputs: tk.Inputs = INPUTS) -> dict[str, str | None]:
    return {inputs.keyring: KEY, inputs.source: inputs.source_text()}


CONVERGED = dpkg(dict.fromkeys(PACKAGES, "1.18.2-1"), tuple(PACKAGES))


def test_a_node_in_place_needs_no_repository_read_no_apt_no_write():
    result = tk.plan(INPUTS, read(CONVERGED), KEY, in_place(), probed=False)
    assert not result["repo_changes"] and not result["update_needed"] and not result["probe_needed"]
    assert result["packages"]["install"] == [] and result["to_hold"] == []
    assert not result["runtime_config"]["write"] and not result["udev_rule"]["write"]
    assert [f["path"] for f in result["files"] if f["changed"]] == []


def test_a_fresh_node_reads_the_repository_and_writes_everything():
    result = tk.plan(INPUTS, read(config=None, udev=None), KEY, {}, probed=False)
    assert result["repo_changes"] and result["update_needed"] and result["probe_needed"]
    assert [f["path"] for f in result["files"] if f["changed"]] == [INPUTS.keyring, INPUTS.source]
    assert result["hold_after_apt"] == list(PACKAGES)
    # config.toml comes with the packages: it is merged when it is there, after apt.
    assert not result["runtime_config"]["write"] and result["udev_rule"]["write"]
    # A repository read earlier in the run (site.yml's preflight play) is not read again.
    assert not tk.plan(INPUTS, read(config=None), KEY, {}, probed=True)["probe_needed"]


def test_a_changed_key_or_source_is_written_and_the_lists_updated():
    other = tk.Inputs(repo_url="http://repo/libnvidia-container", channel="experimental")
    result = tk.plan(other, read(CONVERGED), KEY, in_place(), probed=False)
    assert [f["path"] for f in result["files"] if f["changed"]] == [other.source]
    assert result["update_needed"] and result["update_lists_argv"] == _apt.update_lists_argv(other.source)
    assert "/experimental/deb/amd64" in other.source_text()


def test_config_and_udev_rule_are_written_only_when_they_differ():
    result = tk.plan(INPUTS, read(CONVERGED, config="#a = false\n", udev="old\n"), KEY, in_place(), probed=True)
    assert result["runtime_config"]["write"] and result["runtime_config"]["content"] == "a = true\n"
    assert result["udev_rule"]["write"]
    mode = read(CONVERGED)
    mode.modes[tk.UDEV_RULE_FILE] = "0600"
    assert tk.plan(INPUTS, mode, KEY, in_place(), probed=True)["udev_rule"]["write"]


def test_the_steps_of_a_node_in_place_are_none_and_each_change_turns_its_step_on():
    # tasks/main.yml includes packages.yml and configure.yml only for their step: a step left off that had work
    # would leave the node unchanged without a word.
    def steps(inputs=INPUTS, node=None, files=None):
        return tk.plan(inputs, node or read(CONVERGED), KEY, in_place(inputs) if files is None else files, True)[
            "steps"
        ]

    assert steps() == {"packages": False, "configure": False}
    assert steps(files={}) == {"packages": True, "configure": False}  # key and source
    one_off = dict.fromkeys(PACKAGES, "1.18.2-1") | {PACKAGES[0]: "1.17.8-1"}
    assert steps(node=read(dpkg(one_off, tuple(PACKAGES))))["packages"]  # a package off the pin
    assert steps(node=read(dpkg(dict.fromkeys(PACKAGES, "1.18.2-1"))))["packages"]  # only the holds
    assert steps(tk.Inputs(hold=False, runtime_config={"a": True}))["packages"]  # holds to release
    assert steps(node=read(CONVERGED, config="#a = false\n")) == {"packages": False, "configure": True}
    assert steps(node=read(CONVERGED, udev=None))["configure"]
    assert steps(node=read(CONVERGED, unlinked=["/dev/nvidia0"]))["configure"]
    assert not steps(tk.Inputs(dev_char_symlinks=False), read(CONVERGED, unlinked=["/dev/nvidia0"], udev=None))[
        "configure"
    ]


def test_holds_are_released_when_not_wanted():
    result = tk.plan(tk.Inputs(hold=False), read(CONVERGED), KEY, in_place(tk.Inputs(hold=False)), probed=True)
    assert result["to_unhold"] == sorted(PACKAGES) and result["hold_after_apt"] == []


def test_cdi_units_in_place_need_nothing_and_an_old_spec_goes():
    units = {"cdi_units": True, "cdi_path_enabled": True, "cdi_path_active": True, "cdi_service_enabled": True}
    listed = {"cdi_list": ["nvidia.com/gpu=0", "nvidia.com/gpu=all"], "cdi_list_rc": 0}
    node = read(CONVERGED, **units, **listed, cdi_spec=True, cdi_own_spec=True)
    cdi = tk.plan(INPUTS, node, KEY, in_place(), probed=True)["cdi"]
    assert not cdi["change_units"] and cdi["generated"] and cdi["ok"] and cdi["remove_own_spec"]
    node.cdi_path_active = False
    assert tk.plan(INPUTS, node, KEY, in_place(), probed=True)["cdi"]["change_units"]


def test_absent_removes_packages_holds_and_files():
    result = tk.plan(tk.Inputs(state="absent"), read(CONVERGED), None, {}, probed=True)
    assert result["packages"]["to_remove"] == sorted(PACKAGES) and result["packages"]["held"] == sorted(PACKAGES)
    assert tk.UDEV_RULE_FILE in result["remove_files"]


def test_inputs_are_checked():
    with pytest.raises(tk.Refusal, match="one exact package version"):
        tk.check_inputs(tk.Inputs(version="latest"))
    with pytest.raises(tk.Refusal, match="trusted only by its fingerprint"):
        tk.check_inputs(tk.Inputs(repo_key_fingerprints=()))


def test_the_offer_must_have_the_version_and_a_good_signature():
    with pytest.raises(tk.Refusal, match=r"apt refuses the NVIDIA Container Toolkit repository .* NO_PUBKEY"):
        tk.check_offer(INPUTS, _apt.SourceCheck(update_error="E: NO_PUBKEY 1234", probed=True))
    offered = {name: ["1.18.2-1", "1.18.1-1", "1.17.8-1"] for name in PACKAGES}
    tk.check_offer(INPUTS, _apt.SourceCheck(offered=offered, probed=True))
    with pytest.raises(tk.Refusal, match=r"has no version 1.99.0-1 of .* 1.18.2-1, 1.18.1-1, 1.17.8-1"):
        tk.check_offer(tk.Inputs(version="1.99.0-1"), _apt.SourceCheck(offered=offered, probed=True))


def test_the_read_parses():
    out = "\n".join(
        [
            "@@dpkg",
            "nvidia-container-toolkit|1.18.2-1|hold ok installed",
            f"@@file 644 {tk.RUNTIME_CONFIG_FILE}",
            "YSA9IHRydWUK",
            f"@@nofile {tk.UDEV_RULE_FILE}",
            "@@cdi-units",
            "enabled",
            "active",
            "static",
            "@@cdi-spec",
            "@@cdi-list 0",
            "INFO[0000] Found 3 CDI devices",
            "nvidia.com/gpu=0",
            "@@unlinked",
            "/dev/nvidia1",
        ]
    )
    node = tk.parse_read(out)
    assert node.dpkg["nvidia-container-toolkit"].held
    assert node.files == {tk.RUNTIME_CONFIG_FILE: "a = true\n", tk.UDEV_RULE_FILE: None}
    assert node.modes == {tk.RUNTIME_CONFIG_FILE: "0644"}
    assert node.cdi_units and node.cdi_path_enabled and node.cdi_path_active and node.cdi_service_enabled
    assert node.cdi_spec and node.cdi_list_rc == 0 and "nvidia.com/gpu=0" in node.cdi_list
    assert node.unlinked == ["/dev/nvidia1"]


@pytest.mark.skipif(not shutil.which("dpkg-query"), reason="needs a Debian-family machine")
def test_the_read_script_runs_under_a_posix_shell():
    said = subprocess.run(tk.read_argv(tk.Inputs(cdi=True), full=True), capture_output=True, text=True, check=False)
    assert said.returncode == 0, said.stderr
    node = tk.parse_read(said.stdout)
    assert set(node.files) == {tk.RUNTIME_CONFIG_FILE, tk.UDEV_RULE_FILE, tk.Inputs().keyring, tk.Inputs().source}
    links = subprocess.run(tk.links_argv(), capture_output=True, text=True, check=False)
    assert links.returncode == 0 and links.stdout.startswith("@@unlinked")


def test_the_debian_family_on_x86_64_and_aarch64_are_platforms_of_the_role():
    tk.check_platform(tk.Inputs(os_family="Debian", distribution="Ubuntu", architecture="aarch64"))


def test_the_rhel_family_is_refused_with_what_to_do_instead():
    with pytest.raises(tk.Refusal) as refused:
        tk.check_platform(tk.Inputs(os_family="RedHat", distribution="Rocky"))
    assert str(refused.value).startswith("kubegpu.node.nvidia_container_toolkit does not support Rocky (RHEL family)")
    assert "https://nvidia.github.io/libnvidia-container/stable/rpm/" in str(refused.value)


@pytest.mark.parametrize(("os_family", "architecture"), [("Suse", "x86_64"), ("Debian", "ppc64le")])
def test_another_system_or_architecture_is_refused(os_family, architecture):
    with pytest.raises(tk.Refusal, match=r"supports the Debian family \(Debian, Ubuntu\) on x86_64 and aarch64"):
        tk.check_platform(tk.Inputs(os_family=os_family, distribution="X", architecture=architecture))


def test_the_toolkit_links_the_devices_the_reload_guard_counts():
    # kubegpu.node.service_config holds a daemon-reload back while an NVIDIA device it lists has no /dev/char link and
    # points at this role to make them; the role must look at the same devices (it looked at /dev/nvidia* only, so a
    # MIG-capable GPU's /dev/nvidia-caps devices kept the reload held back run after run), and so must the stand-in
    # nvidia-ctk, as the real one links them (--create-all).
    def globs(script: str) -> list[list[str]]:
        return [line.split(" in ", 1)[1].split(";")[0].split() for line in script.splitlines() if "for dev in" in line]

    standin = Path(__file__).parents[3] / "aptrepo/files/nvidia-container-toolkit/nvidia-ctk"
    assert globs(tk.LINKS_SCRIPT) == globs(sc.GPU_PROBE_SCRIPT) == globs(standin.read_text())
    assert globs(tk.LINKS_SCRIPT) == [["/dev/nvidia*", "/dev/nvidia-caps/*"]]

# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The decisions of roles/_common's action; tests/integration/test_common_role.py runs the layer itself.

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _node_layer as nl

DEBIAN_12 = {"distribution": "Debian", "distribution_major_version": "12", "os_family": "Debian"}


@pytest.mark.parametrize(
    ("caller", "caller_path", "refused"),
    [
        ("kubegpu.node.nvidia_driver", "/c/ansible_collections/kubegpu/node/roles/nvidia_driver", False),
        # A checkout used as a roles path: the caller is the folder's name, beside roles/_common.
        ("nvidia_driver", "/src/roles/nvidia_driver", False),
        ("someone.else.role", "/elsewhere/roles/role", True),
        ("", "", True),
    ],
)
def test_only_a_role_of_this_collection_may_use_the_layer(caller, caller_path, refused):
    said = nl.refusal(caller, caller_path, "/src/roles/_common")
    assert (said is not None) is refused
    if refused:
        assert said.startswith("kubegpu.node._common is internal")


@pytest.mark.parametrize(
    ("rc", "stdout", "stderr", "found"),
    [
        (0, "2.7 /usr/bin/python2.7\n", "", "(it has Python 2.7 /usr/bin/python2.7)"),
        (0, "3.7 /usr/bin/python3.7", "", "(it has Python 3.7 /usr/bin/python3.7)"),
        (127, "", "/bin/sh: 1: python3: not found\n", "(python3 did not run: /bin/sh: 1: python3: not found)"),
        (0, "garbage", "", "(it has Python garbage)"),
    ],
)
def test_a_python_ansible_cannot_use_is_refused_with_what_was_found(rc, stdout, stderr, found):
    said = nl.python_refusal("node-a", "kubegpu.node.kubelet", rc, stdout, stderr)
    assert said is not None
    assert said.startswith(f"node-a has no Python 3.8 or later {found}. ")
    assert "(kubegpu.node.kubelet)" in said and said.endswith("Nothing was changed.")


@pytest.mark.parametrize("version", ["3.8", "3.11", "3.14", "4.0"])
def test_python_3_8_and_later_pass(version):
    assert nl.python_refusal("node-a", "r", 0, f"{version} /usr/bin/python3\n", "") is None


def test_the_python_command_prints_what_the_check_reads():
    # The command as the node's shell runs it (NodeAction.command quotes each word with shlex), with this interpreter.
    said = subprocess.run(
        ["sh", "-c", shlex.join(nl.python_argv(sys.executable))], capture_output=True, text=True, check=True
    )
    assert nl.python_refusal("here", "r", 0, said.stdout, said.stderr) is None
    assert said.stdout.split()[1] == sys.executable


def test_an_interpreter_path_with_a_quote_stays_one_word():
    said = subprocess.run(
        ["sh", "-c", shlex.join(nl.python_argv("/no/such it's"))], capture_output=True, text=True, check=False
    )
    assert said.returncode == 127 and "/no/such it's" in said.stderr


def test_missing_facts():
    assert nl.missing_facts({}) == list(nl.FACTS)
    assert nl.missing_facts(dict.fromkeys(nl.FACTS, "x")) == []


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        ({"default.yml", "Debian-12.yml", "Debian.yml"}, ["default.yml", "Debian-12.yml"]),
        ({"default.yml", "Debian.yml"}, ["default.yml", "Debian.yml"]),
        ({"Debian.yml"}, ["Debian.yml"]),
        ({"default.yml", "RedHat.yml"}, ["default.yml"]),
        (set(), []),
    ],
)
def test_default_then_the_most_specific_os_file(present, expected):
    found = nl.os_files("/r/vars/os", DEBIAN_12, exists=lambda path: path.rsplit("/", 1)[1] in present)
    assert found == [f"/r/vars/os/{name}" for name in expected]


def test_the_os_family_file_is_the_last_resort():
    ubuntu = {"distribution": "Ubuntu", "distribution_major_version": "24", "os_family": "Debian"}
    found = nl.os_files("/r", ubuntu, exists=lambda path: path in {"/r/default.yml", "/r/Debian.yml"})
    assert found == ["/r/default.yml", "/r/Debian.yml"]


@pytest.mark.parametrize(
    ("kind", "value", "fits"),
    [
        ("bool", "false", True),
        ("bool", "Yes", True),
        ("bool", False, True),
        ("bool", "maybe", False),
        ("dict", {"DevicePlugins": True}, True),
        ("dict", ["DevicePlugins=true"], False),
        ("list", ["a"], True),
        ("list", "a", False),
        ("list", {"a": 1}, False),
        ("str", "x", True),
        ("path", 3, False),
        ("raw", None, True),
    ],
)
def test_an_old_value_fits_the_new_names_type_or_is_left_alone(kind, value, fits):
    assert nl.fits(kind, value) is fits


TABLE = [
    {"old": "kubelet_feature_gates", "new": "kubelet_gates", "type": "dict", "removed_in": "2.0.0"},
    {"old": "old_flag", "new": "new_flag", "type": "bool", "removed_in": "2.0.0"},
    {"old": "never_set", "new": "other", "type": "str", "removed_in": "2.0.0"},
]


def test_renamed_variables_used_and_left_alone():
    used, messages = nl.renamed(
        TABLE, {"kubelet_feature_gates": ["DevicePlugins=true"], "old_flag": "true"}, "kubegpu.node.kubelet"
    )
    assert used == [{"old": "old_flag", "new": "new_flag"}]
    assert messages == [
        "kubelet_feature_gates is set to a list, not the dict that kubegpu.node.kubelet read under that name before it "
        "became kubelet_gates: it is another tool's setting (kubespray or DeepOps use the name) and is left alone. Set "
        "kubelet_gates for this role.",
        "DEPRECATED: old_flag is the old name of new_flag (kubegpu.node.kubelet), removed in 2.0.0; its value was used "
        "for new_flag. Rename it in your inventory.",
    ]


def test_no_old_name_set_nothing_to_say():
    assert nl.renamed(TABLE, {}, "r") == ([], [])


def test_a_role_with_renamed_variables_must_import_the_renaming_file():
    renamed = [{"old": "a_old", "new": "a"}, {"old": "b_old", "new": "b"}]
    refused = nl.renames_refusal("kubegpu.node.r", renamed, applied=False)
    assert refused is not None
    assert refused.startswith("kubegpu.node.r has renamed variables (a_old, b_old)")
    assert "tasks_from: node_renamed" in refused
    assert nl.renames_refusal("kubegpu.node.r", renamed, applied=True) is None
    assert nl.renames_refusal("kubegpu.node.r", [], applied=False) is None


def test_only_the_site_playbook_may_call_the_layer_for_roles_of_this_collection(tmp_path):
    for role in ("nvidia_driver", "kubelet", "_common"):
        (tmp_path / role).mkdir()
    own = str(tmp_path)
    assert nl.site_refusal(nl.SITE, ["nvidia_driver", "kubelet"], own) is None
    assert nl.site_refusal(nl.SITE, [], own) is None
    assert nl.site_refusal(nl.SITE, ["kubelet", "other"], own) == (
        "other: not a role of kubegpu.node whose node layer kubegpu.node.site runs."
    )
    assert nl.site_refusal(nl.SITE, ["_common", "../roles"], own).startswith("_common, ../roles: not a role")
    assert nl.site_refusal("kubegpu.node.nvidia_driver", ["kubelet"], own) == nl.INTERNAL

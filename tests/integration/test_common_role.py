"""roles/_common, the node layer every role imports first: tested once here, not per role.

A throwaway collection `kubegpu.node` in the test's folder holds the real roles/_common and plugins/ (links) beside a
role `probe` that imports it as the collection's roles do, with OS variable files the test chooses. The host is this
machine (local connection); its Python and facts are real, and a stand-in interpreter plays an old or missing Python.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

PROBE_TASKS = """\
---
- name: Check the node's Python and load the variables of its system
  ansible.builtin.import_role:
    name: kubegpu.node._common
    tasks_from: {tasks_from}

- name: Write what the chain loaded
  ansible.builtin.copy:
    content: "{{ {'level': __probe_level, 'shared': __probe_shared, 'flag': probe_flag | bool,
                  'gates': probe_gates, 'distribution': ansible_facts['distribution']} | to_json }}"
    dest: "{{ probe_out }}"
    mode: "0600"
"""


def _collection(ansible, os_files: dict[str, dict], tasks_from: str = "node_renamed", renamed=None) -> Path:
    root = ansible.workdir / "collections"
    node = root / "ansible_collections" / "kubegpu" / "node"
    (node / "roles").mkdir(parents=True)
    (node / "galaxy.yml").write_text(
        "namespace: kubegpu\nname: node\nversion: 0.0.1\nreadme: README.md\nauthors: [t]\n"
    )
    (node / "roles" / "_common").symlink_to(ansible.repo / "roles" / "_common")
    # Its action, kubegpu.node.node_layer, and what the action imports.
    (node / "plugins").symlink_to(ansible.repo / "plugins")
    probe = node / "roles" / "probe"
    (probe / "tasks").mkdir(parents=True)
    (probe / "tasks" / "main.yml").write_text(PROBE_TASKS.replace("{tasks_from}", tasks_from))
    (probe / "defaults").mkdir()
    (probe / "defaults" / "main.yml").write_text("probe_flag: false\nprobe_gates: {}\n")
    (probe / "vars").mkdir()
    (probe / "vars" / "main.yml").write_text(
        yaml.safe_dump({"__probe_renamed": RENAMED if renamed is None else renamed})
    )
    if os_files:
        (probe / "vars" / "os").mkdir()
        for name, variables in os_files.items():
            (probe / "vars" / "os" / name).write_text(yaml.safe_dump(variables))
    return root


def _run(
    ansible,
    os_files: dict[str, dict],
    plays: int = 1,
    roles: int = 1,
    play_vars=None,
    tasks_from: str = "node_renamed",
    renamed=None,
    **host: object,
):
    collections = _collection(ansible, os_files, tasks_from, renamed)
    playbook = ansible.workdir / "probe.yml"
    play = {
        "hosts": "gpu_nodes",
        "gather_facts": False,
        "tasks": [{"name": "The probe role", "ansible.builtin.include_role": {"name": "kubegpu.node.probe"}}] * roles,
    }
    play_vars = play_vars or [{}] * plays
    playbook.write_text(yaml.safe_dump([{"name": f"Probe {n}", **play, "vars": play_vars[n]} for n in range(plays)]))
    inventory = ansible.inventory({"node-a": dict(host)}, probe_out=str(ansible.workdir / "out.json"))
    return ansible.playbook(
        playbook, inventory=inventory, env={"ANSIBLE_COLLECTIONS_PATH": str(collections)}, skip_chain=False
    )


def _this_system() -> tuple[str, str]:
    """This machine's distribution and major version, as setup names them (Debian, 12)."""
    release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    return release["ID"].strip('"').capitalize(), release.get("VERSION_ID", "").strip('"').split(".")[0]


RENAMED = [
    {"old": "probe_old_flag", "new": "probe_flag", "type": "bool", "removed_in": "9.0.0"},
    {"old": "probe_old_gates", "new": "probe_gates", "type": "dict", "removed_in": "9.0.0"},
]
SHARED = {"__probe_shared": "from default.yml", "__probe_level": "default", "__probe_os_tested": True}


@pytest.mark.parametrize(
    ("levels", "expected"),
    [(("major", "distribution"), "major"), (("distribution",), "distribution"), ((), "default")],
)
def test_the_most_specific_os_file_wins_over_default(ansible, levels, expected):
    distribution, major = _this_system()
    names = {"major": f"{distribution}-{major}.yml", "distribution": f"{distribution}.yml"}
    os_files = {"default.yml": SHARED}
    for level in levels:
        os_files[names[level]] = {"__probe_level": level}
    run = _run(ansible, os_files)
    assert run.returncode == 0, run.output
    loaded = json.loads((ansible.workdir / "out.json").read_text())
    # Only the first file found is loaded over default.yml; what it does not set comes from default.yml.
    # The facts the layer gathered (the play gathers none) are the host's facts for the tasks after it.
    assert loaded == {
        "level": expected,
        "shared": "from default.yml",
        "flag": False,
        "gates": {},
        "distribution": distribution,
    }
    assert "is not among the systems" not in run.output


def test_an_untested_system_is_noted(ansible):
    run = _run(ansible, {"default.yml": {**SHARED, "__probe_os_tested": False}})
    assert run.returncode == 0, run.output
    assert "is not among the systems this collection's CI runs kubegpu.node.probe on" in run.output


def test_a_role_called_again_in_the_run_loads_its_os_files_and_says_its_notes_once(ansible):
    # site.yml calls the layer for a role in its preflight play and again in the batch: include_vars' variables and
    # set_fact's last for the whole run, so the second call loads nothing and says nothing again.
    run = _run(
        ansible,
        {"default.yml": {**SHARED, "__probe_os_tested": False}},
        plays=2,
        roles=2,
        probe_old_flag="true",
    )
    assert run.returncode == 0, run.output
    assert run.output.count("is not among the systems this collection's CI runs kubegpu.node.probe on") == 1
    assert run.output.count("DEPRECATED: probe_old_flag is the old name of probe_flag") == 1
    assert json.loads((ansible.workdir / "out.json").read_text())["flag"] is True
    # One include_vars run in all four calls: the later three skip it (an empty loop).
    assert run.output.count("TASK [kubegpu.node._common : Load the variables every system shares") == 4
    assert run.output.count("default.yml)") == 1, run.output


def _interpreter(ansible, script: str) -> str:
    path = ansible.workdir / "python-standin"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    path.chmod(0o755)
    return str(path)


def test_a_python_older_than_3_8_is_refused_before_any_module_runs(ansible):
    old = _interpreter(ansible, 'echo "2.7 /usr/bin/python2.7"\n')
    run = _run(ansible, {"default.yml": SHARED}, ansible_python_interpreter=old)
    assert run.returncode != 0, run.output
    assert "node-a has no Python 3.8 or later (it has Python 2.7 /usr/bin/python2.7)" in run.output, run.output
    assert "point ansible_python_interpreter at it. Nothing was changed." in run.output
    assert not (ansible.workdir / "out.json").exists()


def test_the_python_check_runs_once_a_run_however_many_roles_start_with_the_layer(ansible):
    # site.yml runs four roles' preflights in one play and two roles again in the next: the check (a `raw` round
    # trip) ran six times a host; the interpreter cannot change in between.
    calls = ansible.workdir / "version-checks"
    real = subprocess.run(["sh", "-c", "command -v python3"], capture_output=True, text=True, check=True).stdout
    interpreter = _interpreter(
        ansible,
        f"""\
        case "$*" in *version_info*) echo check >>{calls} ;; esac
        exec {real.strip()} "$@"
        """,
    )
    run = _run(ansible, {"default.yml": SHARED}, plays=2, roles=2, ansible_python_interpreter=interpreter)
    assert run.returncode == 0, run.output
    assert calls.read_text().splitlines() == ["check"], run.output


def test_another_interpreter_later_in_the_run_is_checked_again(ansible):
    # molecule/containerd's verify gives one task an old interpreter after the role ran with the node's python3.
    old = _interpreter(ansible, 'echo "2.7 /usr/bin/python2.7"\n')
    run = _run(ansible, {"default.yml": SHARED}, plays=2, play_vars=[{}, {"ansible_python_interpreter": old}])
    assert run.returncode != 0, run.output
    assert "node-a has no Python 3.8 or later (it has Python 2.7 /usr/bin/python2.7)" in run.output, run.output


def test_a_missing_python_is_refused_with_the_shells_error(ansible):
    run = _run(ansible, {"default.yml": SHARED}, ansible_python_interpreter=str(ansible.workdir / "no-such-python"))
    assert run.returncode != 0, run.output
    assert "node-a has no Python 3.8 or later (python3 did not run:" in run.output, run.output
    assert "no-such-python" in run.output


def test_a_role_without_os_files_gets_the_python_check_and_the_facts(ansible):
    playbook_vars = {"__probe_level": "none", "__probe_shared": "none"}
    run = _run(ansible, {}, **playbook_vars)
    assert run.returncode == 0, run.output
    loaded = json.loads((ansible.workdir / "out.json").read_text())
    assert (loaded["level"], loaded["shared"]) == ("none", "none")


def test_it_refuses_to_run_on_its_own(ansible):
    playbook = ansible.workdir / "alone.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "The node layer alone",
                    "hosts": "gpu_nodes",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Include it",
                            "ansible.builtin.include_role": {"name": "kubegpu.node._common", "tasks_from": "node"},
                        }
                    ],
                }
            ]
        )
    )
    run = ansible.playbook(playbook, inventory=ansible.inventory({"node-a": {}}), skip_chain=False)
    assert run.returncode != 0, run.output
    assert "kubegpu.node._common is internal" in run.output
    assert "Load the variables every system shares" not in run.output


def test_an_old_name_with_the_new_ones_type_is_used_with_a_warning(ansible):
    # As -e or AWX give it: the string "true".
    run = _run(ansible, {"default.yml": SHARED}, probe_old_flag="true", probe_old_gates={"DevicePlugins": True})
    assert run.returncode == 0, run.output
    loaded = json.loads((ansible.workdir / "out.json").read_text())
    assert (loaded["flag"], loaded["gates"]) == (True, {"DevicePlugins": True})
    assert (
        "DEPRECATED: probe_old_flag is the old name of probe_flag (kubegpu.node.probe), removed in 9.0.0" in run.output
    )


def test_an_old_name_set_to_another_tools_shape_is_left_alone(ansible):
    # kubespray's kubelet_feature_gates is a list of "Name=true" strings; the role's was a dict.
    run = _run(ansible, {"default.yml": SHARED}, probe_old_gates=["DevicePlugins=true"])
    assert run.returncode == 0, run.output
    assert json.loads((ansible.workdir / "out.json").read_text())["gates"] == {}
    assert "probe_old_gates is set to a list, not the dict that kubegpu.node.probe read" in run.output
    assert "DEPRECATED" not in run.output


def test_no_old_name_no_message(ansible):
    run = _run(ansible, {"default.yml": SHARED})
    assert run.returncode == 0, run.output
    assert "DEPRECATED" not in run.output and "is left alone" not in run.output


def test_a_role_without_renamed_variables_imports_the_layer_without_the_renaming_task(ansible):
    run = _run(ansible, {"default.yml": SHARED}, tasks_from="node", renamed=[])
    assert run.returncode == 0, run.output
    assert json.loads((ansible.workdir / "out.json").read_text())["level"] == "default"
    assert "Use the old names of renamed variables" not in run.output


def test_a_role_with_renamed_variables_that_imports_the_layer_without_the_renaming_task_is_refused(ansible):
    # Its old names would be announced and then not used.
    run = _run(ansible, {"default.yml": SHARED}, tasks_from="node", probe_old_flag="true")
    assert run.returncode != 0, run.output
    assert "kubegpu.node.probe has renamed variables (probe_old_flag, probe_old_gates)" in run.output
    assert "tasks_from: node_renamed" in run.output
    assert not (ansible.workdir / "out.json").exists()


SITE_LAYER = {
    "name": "The node layer of every role, in one call",
    "kubegpu.node.node_layer": {
        "caller": "{{ probe_caller }}",
        "roles": "{{ probe_roles }}",
        "gather": "{{ probe_gather | default(false) }}",
        "done": "{{ __common_node | default({}) }}",
    },
    "register": "__common_node",
}
SITE_TASKS = [
    SITE_LAYER,
    {
        "name": "Load the variables of the node's system for each role",
        "ansible.builtin.include_vars": {"file": "{{ item }}"},
        "loop": "{{ __common_node.os_files }}",
    },
    {
        "name": "Use the old names of renamed variables",
        "ansible.builtin.set_fact": {"{{ item.new }}": "{{ lookup('ansible.builtin.vars', item.old) }}"},
        "loop": "{{ __common_node.renamed }}",
    },
    # The role's own layer later in the run (as a role's batch run in site.yml) finds it done.
    {"name": "The probe role", "ansible.builtin.include_role": {"name": "kubegpu.node.probe"}},
]


def _site_run(ansible, caller: str = "kubegpu.node.site", roles=("probe",), **host: object):
    collections = _collection(ansible, {"default.yml": {**SHARED, "__probe_os_tested": False}})
    playbook = ansible.workdir / "site.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "gpu_nodes", "gather_facts": False, "tasks": SITE_TASKS}]))
    inventory = ansible.inventory(
        {"node-a": dict(host)},
        probe_out=str(ansible.workdir / "out.json"),
        probe_caller=caller,
        probe_roles=list(roles),
    )
    return ansible.playbook(
        playbook, inventory=inventory, env={"ANSIBLE_COLLECTIONS_PATH": str(collections)}, skip_chain=False
    )


def test_site_calls_the_layer_once_for_all_its_roles_and_their_own_calls_find_it_done(ansible):
    # site.yml's preflight: one call for every role of the chain (its facts, each role's OS files, each role's renamed
    # variables read from the role's vars/main.yml), in place of one call in each role.
    run = _site_run(ansible, probe_old_flag="true")
    assert run.returncode == 0, run.output
    assert json.loads((ansible.workdir / "out.json").read_text())["flag"] is True
    assert run.output.count("DEPRECATED: probe_old_flag is the old name of probe_flag (kubegpu.node.probe)") == 1
    assert run.output.count("is not among the systems this collection's CI runs kubegpu.node.probe on") == 1
    assert run.output.count("default.yml)") == 1, run.output


@pytest.mark.parametrize(
    ("caller", "roles", "said"),
    [
        ("kubegpu.node.site", ["probe", "elsewhere"], "elsewhere: not a role of kubegpu.node"),
        ("kubegpu.node.site", ["_common"], "_common: not a role of kubegpu.node"),
        ("my.own.playbook", ["probe"], "kubegpu.node._common is internal"),
    ],
)
def test_a_call_for_several_roles_is_refused_unless_site_names_roles_of_this_collection(ansible, caller, roles, said):
    run = _site_run(ansible, caller=caller, roles=roles)
    assert run.returncode != 0, run.output
    assert said in run.output, run.output
    assert not (ansible.workdir / "out.json").exists()


def test_site_gathers_the_facts_once_a_run_even_when_a_fact_cache_has_them(ansible):
    # With a fact cache (AWX's fact storage) the roles' facts are known before the run: the node layer of a role
    # gathers only what is missing, site.yml's asks for one gathering a run (its local facts may have changed).
    collections = _collection(ansible, {"default.yml": SHARED})
    playbook = ansible.workdir / "gather.yml"
    layer = {**SITE_LAYER, "kubegpu.node.node_layer": {**SITE_LAYER["kubegpu.node.node_layer"], "done": {}}}
    tasks = [
        {**layer, "register": "known"},
        {**layer, "register": "asked", "vars": {"probe_gather": True}},
        {
            "name": "Write what each call did",
            "ansible.builtin.copy": {
                "content": "{{ {'known': known.gathered, 'asked': asked.gathered,"
                " 'facts': asked.ansible_facts is defined} | to_json }}",
                "dest": "{{ probe_out }}",
                "mode": "0600",
            },
        },
    ]
    playbook.write_text(yaml.safe_dump([{"hosts": "gpu_nodes", "gather_facts": True, "tasks": tasks}]))
    inventory = ansible.inventory(
        {"node-a": {}}, probe_out=str(ansible.workdir / "out.json"), probe_caller="kubegpu.node.site", probe_roles=[]
    )
    run = ansible.playbook(
        playbook, inventory=inventory, env={"ANSIBLE_COLLECTIONS_PATH": str(collections)}, skip_chain=False
    )
    assert run.returncode == 0, run.output
    assert json.loads((ansible.workdir / "out.json").read_text()) == {"known": False, "asked": True, "facts": True}

"""The preflight reuse of the nvidia_driver and nvidia_container_toolkit roles: what its key holds.

With `<role>_preflight_reuse` (site.yml's batches), a role skips its preflight checks when they passed on the host
earlier in the run with the same key. The key must change with every input of the role and must not change with the
role's outputs or the switch itself; otherwise a batch either runs the checks again for nothing or, worse, skips
them for inputs that were never checked. This renders the key, as the role does, for each change.
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml

# role -> (an input to change, its new value; an output of the role, which must not move the key)
CASES = {
    "nvidia_driver": ("nvidia_driver_branch", "570", "nvidia_driver_reboot_required"),
    "nvidia_container_toolkit": ("nvidia_container_toolkit_version", "1.17.8-1", None),
}


def _keys(ansible, role: str) -> dict[str, str]:
    tmp_path = ansible.workdir
    changed_input, new_value, output = CASES[role]
    key = f"{{{{ __{role}_preflight_key }}}}"
    steps: list[tuple[str, dict]] = [
        ("base", {}),
        ("switch", {f"{role}_preflight_reuse": True}),
        ("output", {output: True} if output else {}),
        ("input", {changed_input: new_value}),
        ("new_input", {f"{role}_something_new": "x"}),
    ]
    tasks: list[dict] = []
    for name, facts in steps:
        if facts:
            tasks.append({"name": f"Set {name}", "ansible.builtin.set_fact": facts})
        tasks.append({"name": f"Key after {name}", "ansible.builtin.set_fact": {f"key_{name}": key}})
    tasks.append(
        {
            "name": "Write the keys",
            "ansible.builtin.copy": {
                "dest": str(tmp_path / "keys.json"),
                "content": "{{ {" + ", ".join(f"'{n}': key_{n}" for n in dict(steps)) + "} | to_json }}",
                "mode": "0600",
            },
        }
    )
    playbook = [
        {
            "name": "Render the preflight key",
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [
                str(ansible.repo / "roles" / role / "defaults" / "main.yml"),
                str(ansible.repo / "roles" / role / "vars" / "main.yml"),
            ],
            "tasks": tasks,
        }
    ]
    (tmp_path / "playbook.yml").write_text(yaml.safe_dump(playbook, sort_keys=False))
    run = ansible.playbook(
        tmp_path / "playbook.yml",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        skip_chain=False,
    )
    assert run.returncode == 0, run.output
    return json.loads((tmp_path / "keys.json").read_text())


@pytest.mark.parametrize("role", sorted(CASES))
def test_preflight_key_follows_inputs_only(ansible, role: str) -> None:
    keys = _keys(ansible, role)
    assert len(keys["base"]) == 40, keys  # a SHA-1, rendered rather than left as a template
    # The switch and the role's outputs are not inputs of the checks.
    assert keys["switch"] == keys["base"]
    assert keys["output"] == keys["base"]
    # A changed input, or one the role did not have before, means the checks must run again.
    assert keys["input"] != keys["output"]
    assert keys["new_input"] != keys["input"]

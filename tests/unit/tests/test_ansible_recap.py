"""tests/ansible_recap.py: idempotence judged per host from the PLAY RECAP."""

from __future__ import annotations

from pathlib import Path

import ansible_recap

RECAP = """\
PLAY [Make GPU nodes ready] ****************************************************

TASK [Write the file] **********************************************************
changed: [gpu-a]
ok: [gpu-b]
ok: [gpu-c] => {"msg": "changed=1 in a message is not a recap"}

PLAY RECAP *********************************************************************
gpu-a                      : ok=3    changed=2    unreachable=0    failed=0    skipped=1    rescued=0    ignored=0
gpu-b                      : ok=3    changed=0    unreachable=0    failed=0    skipped=1    rescued=0    ignored=0
gpu-c                      : ok=1    changed=0    unreachable=1    failed=0    skipped=0    rescued=0    ignored=0

"""


def test_each_hosts_counters_are_read():
    recap = ansible_recap.parse_recap(RECAP)
    assert set(recap) == {"gpu-a", "gpu-b", "gpu-c"}
    assert recap["gpu-a"]["changed"] == 2
    assert recap["gpu-c"]["unreachable"] == 1


def test_a_change_of_two_and_an_unreachable_host_are_problems():
    # "changed=1" not in the output would have called this run a no-op.
    assert "changed=1" not in RECAP.split("PLAY RECAP")[1]
    found = ansible_recap.problems(ansible_recap.parse_recap(RECAP))
    assert found == ["gpu-a: changed=2", "gpu-c: unreachable=1"]


def test_a_host_missing_from_the_recap_is_a_problem():
    found = ansible_recap.problems(ansible_recap.parse_recap(RECAP), ["gpu-b", "gpu-d"])
    assert found == ["gpu-d: not in the PLAY RECAP"]


def test_no_recap_is_a_problem_not_a_no_op():
    assert ansible_recap.problems(ansible_recap.parse_recap("ERROR! the playbook could not be read")) == [
        "no PLAY RECAP in the output"
    ]


def test_colours_and_the_last_recap_count():
    coloured = RECAP.replace("gpu-b ", "\x1b[0;32mgpu-b\x1b[0m ") + (
        "\nPLAY RECAP ***\ngpu-a : ok=1 changed=0 unreachable=0 failed=0 skipped=0 rescued=0 ignored=0\n"
    )
    assert ansible_recap.parse_recap(coloured) == {
        "gpu-a": {"ok": 1, "changed": 0, "unreachable": 0, "failed": 0, "skipped": 0, "rescued": 0, "ignored": 0}
    }


def test_the_command_exits_1_and_names_the_host(tmp_path: Path, capsys):
    log = tmp_path / "run.log"
    log.write_text(RECAP)
    assert ansible_recap.main(["--unchanged", str(log), "gpu-b"]) == 0
    assert ansible_recap.main(["--unchanged", str(log)]) == 1
    assert "gpu-a: changed=2" in capsys.readouterr().err

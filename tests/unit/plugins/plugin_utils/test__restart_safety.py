# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils._restart_safety import restart_safety

# As the role's probe prints it on Debian 12 (systemctl show lists the properties in its own order).
CONTAINERD_DEBIAN = "MainPID=512\nKillMode=process\nActiveState=active\nUnitProcesses=4\n"


def probe(**facts) -> str:
    return "".join(f"{key}={value}\n" for key, value in facts.items())


def test_containerd_with_killmode_process_keeps_its_shims():
    assert restart_safety(CONTAINERD_DEBIAN, "containerd") == {"safe": True, "reason": ""}


def test_containerd_killing_its_shims_is_not_safe():
    result = restart_safety(probe(ActiveState="active", KillMode="control-group", UnitProcesses=3), "containerd")
    assert result["safe"] is False
    assert "KillMode=control-group" in result["reason"] and "2 processes" in result["reason"]


@pytest.mark.parametrize("engine", ["containerd", "cri-o"])
def test_nothing_beside_the_daemon_is_safe_whatever_the_killmode(engine):
    assert restart_safety(probe(ActiveState="active", KillMode="mixed", UnitProcesses=1), engine)["safe"] is True


def test_a_runtime_that_does_not_run_is_safe_to_start():
    assert restart_safety(probe(ActiveState="inactive", KillMode="control-group", UnitProcesses=0), "cri-o")["safe"]
    assert restart_safety(probe(ActiveState="failed", ContainersRunning=3), "docker")["safe"]


def test_docker_with_running_containers_and_no_live_restore_is_not_safe():
    result = restart_safety(probe(ActiveState="active", LiveRestoreEnabled="false", ContainersRunning=2), "docker")
    assert result == {
        "safe": False,
        "reason": "dockerd runs without live-restore, so a restart would stop 2 running containers",
    }


def test_docker_with_live_restore_or_nothing_running_is_safe():
    assert restart_safety(probe(ActiveState="active", LiveRestoreEnabled="true", ContainersRunning=5), "docker")["safe"]
    assert restart_safety(probe(ActiveState="active", LiveRestoreEnabled="false", ContainersRunning=0), "docker")[
        "safe"
    ]


def test_docker_that_does_not_answer_is_not_assumed_safe():
    result = restart_safety(probe(ActiveState="active"), "docker")
    assert result["safe"] is False and "did not answer" in result["reason"]


def test_unknown_engine_is_an_error():
    with pytest.raises(ValueError, match="engine must be one of"):
        restart_safety("", "podman")

"""molecule scenarios share .config/molecule/config.yml and state only what they test."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((REPO / ".config" / "molecule" / "config.yml").read_text())
SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))
# What every platform gets from the base configuration (through molecule_yml, or CONTAINERS_CONF for runc and ulimits).
PLATFORM_DEFAULTS = {"pre_build_image", "command", "systemd", "ulimits"}


def _scenario(name: str) -> dict:
    return yaml.safe_load((REPO / "molecule" / name / "molecule.yml").read_text())


def test_the_base_holds_the_driver_the_provisioner_and_the_podman_settings():
    assert BASE["driver"] == {"name": "podman"}
    assert BASE["provisioner"]["options"] == {"diff": True}
    assert BASE["provisioner"]["env"]["CONTAINERS_CONF"].endswith("/tools/containers.conf")
    molecule_yml = BASE["provisioner"]["inventory"]["group_vars"]["all"]["molecule_yml"]
    for key in ("'pre_build_image': true", "'command': '/sbin/init'", "'systemd': 'always'"):
        assert key in molecule_yml
    containers_conf = (REPO / "tools" / "containers.conf").read_text()
    assert 'runtime = "runc"' in containers_conf and '"nofile=1024:1024"' in containers_conf


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_scenario_does_not_repeat_the_base(name):
    scenario = _scenario(name)
    assert not {"dependency", "driver", "verifier", "prerun"} & set(scenario), name
    assert scenario.get("provisioner", {}).get("name") in (None, "ansible")
    assert "options" not in scenario.get("provisioner", {}), "provisioner options belong to the base configuration"
    if "scenario" in scenario:
        assert scenario["scenario"]["test_sequence"] != BASE["scenario"]["test_sequence"]
    for platform in scenario["platforms"]:
        assert not PLATFORM_DEFAULTS & set(platform), platform
        assert "--runtime=runc" not in platform.get("extra_opts", []), platform

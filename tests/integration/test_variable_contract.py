"""The variables' contract, through site.yml: validated on every host first, booleans given as strings read right.

site.yml's preflight play keeps its promise: a bad variable anywhere stops the run before any host changes. site.yml
validates its own variables on every host, and runs each role's `preflight` (and the kubelet's `plan`) entry point on
every host first, with any_errors_fatal; a role included with `tasks_from:` validates its variables only when its
meta/argument_specs.yml has an entry point of that name. Here the hosts are this machine (local connection) and the
container runtime step is on: a stand-in `crio` on PATH is the only runtime it finds, and every path the role writes is
under the test's folder. The last host of the inventory carries a value the role's argument specs refuse. Without the
entry point, the preflight play passed and the first batch wrote its CRI-O drop-in before the last host failed in its
own batch (and site.yml's own settings were checked on the first host only).

Booleans from `-e` and AWX arrive as strings ("false"); role argument specs validate but do not convert them, so each
use reads them with `| bool` (tools/check_argument_specs.py checks every use; these runs check a few end to end).
"""

from __future__ import annotations

import pytest
from kubesim import SimCluster, SimNode

HOSTS = ("gpu-a", "gpu-b", "gpu-c")
ONE = ("gpu-a",)


def _site(ansible, last_host: dict, *args: str, hosts: tuple[str, ...] = HOSTS, **variables: object):
    """site.yml's container runtime step on `hosts` (this machine); `last_host` is merged into the last one's vars."""
    tmp = ansible.workdir
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "crio").write_text("#!/bin/sh\necho 'crio stand-in: never started by this test' >&2\nexit 1\n")
    (bin_dir / "crio").chmod(0o755)
    inventory_hosts = {
        name: {
            "container_runtime_crio_dropin": str(tmp / name / "crio.conf.d" / "99-nvidia.toml"),
            "container_runtime_state_dir": str(tmp / name / "state"),
        }
        for name in hosts
    }
    inventory_hosts[hosts[-1]].update(last_host)
    with SimCluster(nodes=[SimNode(name, gpus=4) for name in hosts]) as cluster:
        inventory = ansible.inventory(
            inventory_hosts,
            kubegpu_kubeconfig=cluster.write_kubeconfig(str(tmp / "kubeconfig")),
            kubegpu_container_runtime=True,
            kubegpu_serial=1,
            container_runtime_engines=["cri-o"],
            **{"container_runtime_require_nvidia_runtime": False, "container_runtime_restart": "never", **variables},
        )
        return ansible.playbook(
            ansible.site,
            "--tags",
            "container_runtime",
            # site.yml's drain window would restart the runtime on this machine.
            "--skip-tags",
            "drain",
            *args,
            inventory=inventory,
            env={"PATH": f"{bin_dir}:{ansible.env()['PATH']}"},
            skip_chain=False,
        )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"container_runtime_restart": "sometimes"}, "value of container_runtime_restart must be one of"),
        ({"container_runtime_engines": ["crio"]}, "value of container_runtime_engines must be one or more of"),
        ({"container_runtime_nvidia_default": "maybe"}, "container_runtime_nvidia_default"),
        # site.yml's own settings: checked once, on the first host, before (run_once).
        ({"kubegpu_drain_timeout": "ten minutes"}, "kubegpu_drain_timeout"),
        ({"kubegpu_gpu_labels": "sometimes"}, "value of kubegpu_gpu_labels must be one of"),
    ],
)
def test_a_bad_value_on_the_last_host_stops_the_run_before_any_host_changes(ansible, bad, message):
    run = _site(ansible, bad)
    assert run.returncode != 0, run.output
    # The last host failed on the argument specs in the preflight play's first task (the playbook's and the included
    # role entry points' at once; the includes do not check again), naming the variable ...
    assert "Check the playbook's variables, and the included roles', against their specs" in run.output, run.output
    assert "Validating arguments against arg spec" not in run.output, run.output
    failed = [line for line in run.output.splitlines() if line.startswith(f"fatal: [{HOSTS[-1]}]")]
    assert failed and message in run.output, run.output
    # ... and the batches never started: no host has a drop-in, every host is unchanged.
    assert "PLAY [Make GPU nodes ready, a batch at a time]" not in run.output, run.output
    assert not list(ansible.workdir.glob("gpu-*/crio.conf.d/*")), run.output
    assert all(run.recap[host]["changed"] == 0 for host in HOSTS), run.recap


def test_good_values_pass_the_preflight_and_the_batches_configure_every_host(ansible):
    run = _site(ansible, {})
    assert run.returncode == 0, run.output
    for host in HOSTS:
        dropin = ansible.workdir / host / "crio.conf.d" / "99-nvidia.toml"
        assert 'default_runtime = "nvidia"' in dropin.read_text(), run.output
        assert run.recap[host]["changed"] > 0, run.recap


def _dropin(ansible, host: str = HOSTS[0]) -> str:
    return (ansible.workdir / host / "crio.conf.d" / "99-nvidia.toml").read_text()


@pytest.mark.parametrize("form", ["-e", "json"])
def test_false_as_a_string_is_false(ansible, form):
    # -e name=false, or an AWX extra variable (JSON/YAML text whose value is the string "false").
    given = (
        "container_runtime_nvidia_default=false" if form == "-e" else '{"container_runtime_nvidia_default": "false"}'
    )
    run = _site(ansible, {}, "-e", given, hosts=ONE)
    assert run.returncode == 0, run.output
    # Read as true before: CRI-O's drop-in made nvidia the default runtime.
    assert "default_runtime" not in _dropin(ansible), _dropin(ansible)
    assert "[crio.runtime.runtimes.nvidia]" in _dropin(ansible)


def test_true_as_a_string_is_true(ansible):
    run = _site(ansible, {}, "-e", "container_runtime_nvidia_default=true", hosts=ONE)
    assert run.returncode == 0, run.output
    assert 'default_runtime = "nvidia"' in _dropin(ansible)


def test_a_string_boolean_is_a_condition_ansible_accepts(ansible):
    # No nvidia-container-runtime here; the check is turned off with the string "false". ansible-core 2.19 refused it
    # as a task condition ("Conditional result ... was derived from value of type 'str'").
    run = _site(
        ansible,
        {},
        "-e",
        "container_runtime_require_nvidia_runtime=false",
        "-e",
        f"container_runtime_nvidia_runtime_path={ansible.workdir / 'no-such-runtime'}",
        hosts=ONE,
    )
    assert run.returncode == 0, run.output
    assert run.recap[ONE[0]]["failed"] == 0, run.recap


def test_a_site_switch_given_as_false_turns_its_step_off(ansible):
    run = _site(ansible, {}, "-e", "kubegpu_container_runtime=false", hosts=ONE)
    assert run.returncode == 0, run.output
    assert not list(ansible.workdir.glob("gpu-*/crio.conf.d/*")), run.output
    assert run.unchanged(ONE) == [], run.recap

"""site.yml's preflight play keeps its promise: a bad variable anywhere stops the run before any host changes.

site.yml runs each role's `preflight` (and the kubelet's `plan`) entry point on every host first, with
any_errors_fatal; a role included with `tasks_from:` validates its variables only when its meta/argument_specs.yml has
an entry point of that name. Here the hosts are this machine (local connection) and the container runtime step is on:
a stand-in `crio` on PATH is the only runtime it finds, and every path the role writes is under the test's folder.
The last host of the inventory carries a value the role's argument specs refuse. Without the entry point, the preflight
play passed and the first batch wrote its CRI-O drop-in before the last host failed in its own batch.
"""

from __future__ import annotations

import pytest
from kubesim import SimCluster, SimNode

HOSTS = ("gpu-a", "gpu-b", "gpu-c")


def _site(ansible, last_host: dict, *args: str):
    tmp = ansible.workdir
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "crio").write_text("#!/bin/sh\necho 'crio stand-in: never started by this test' >&2\nexit 1\n")
    (bin_dir / "crio").chmod(0o755)
    hosts = {
        name: {
            "container_runtime_crio_dropin": str(tmp / name / "crio.conf.d" / "99-nvidia.toml"),
            "container_runtime_state_dir": str(tmp / name / "state"),
        }
        for name in HOSTS
    }
    hosts[HOSTS[-1]].update(last_host)
    with SimCluster(nodes=[SimNode(name, gpus=4) for name in HOSTS]) as cluster:
        inventory = ansible.inventory(
            hosts,
            kubegpu_kubeconfig=cluster.write_kubeconfig(str(tmp / "kubeconfig")),
            kubegpu_container_runtime=True,
            kubegpu_serial=1,
            container_runtime_engines=["cri-o"],
            container_runtime_require_nvidia_runtime=False,
            container_runtime_restart="never",
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
    ],
)
def test_a_bad_value_on_the_last_host_stops_the_run_before_any_host_changes(ansible, bad, message):
    run = _site(ansible, bad)
    assert run.returncode != 0, run.output
    # The last host failed on its argument specs in the preflight play, naming the variable ...
    assert "Validating arguments against arg spec 'preflight'" in run.output, run.output
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

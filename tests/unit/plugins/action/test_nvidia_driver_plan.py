# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubegpu.node.nvidia_driver_plan run by ansible-playbook against this machine (connection local): its argument
spec, its reads (the node read, the source check with real apt against the signed stand-in CUDA repository served as
file:// URLs, kubegpu.node.nvidia_pci_gpus), its refusals and its result, as the role sees them. This machine has no
driver and its running kernel has no headers; molecule/nvidia_driver* run it on nodes with DKMS builds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[4]
CUDA_PATH = "compute/cuda/repos/debian12/x86_64"

pytestmark = pytest.mark.skipif(
    not (shutil.which("apt-get") and Path("/usr/lib/apt/apt-helper").exists() and shutil.which("apt-ftparchive")),
    reason="needs apt, apt-helper and apt-ftparchive",
)


@pytest.fixture
def repo(cuda_repo):
    return cuda_repo


def mirror_args(root: Path, fingerprints: list[str] | None, tree: str = "good", **more) -> dict:
    """The action's arguments for source mirror at the stand-in repository, its key by URL."""
    args = {
        "branch": "580",
        "source": "mirror",
        "repository_url": mirror(root, tree),
        "repository_key_url": mirror(root) + "3bf863cc.pub",
        "kernels": ["6.1.0-99-amd64"],
        **more,
    }
    if fingerprints is not None:
        args["repository_key_fingerprints"] = fingerprints
    return args


def run(tmp_path: Path, args: dict, check: bool = False) -> dict:
    """One task of the action; its result as the JSON callback reports it."""
    playbook = tmp_path / "plan.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {"ansible.builtin.setup": {"gather_subset": ["min"]}},
                        {"kubegpu.node.nvidia_driver_plan": args, "register": "plan", "ignore_errors": True},
                    ],
                }
            ]
        )
    )
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
    }
    said = subprocess.run(
        ["ansible-playbook", "-c", "local", "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}"]
        + (["--check"] if check else [])
        + [str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    report = json.loads(said.stdout)
    return report["plays"][0]["tasks"][1]["hosts"]["localhost"]


def mirror(repo_root: Path, tree: str = "good") -> str:
    return f"file://{repo_root}/{tree}/{CUDA_PATH}/"


def test_a_full_read_plans_from_the_signed_source(tmp_path, repo):
    root, keys = repo
    result = run(tmp_path, mirror_args(root, [keys["good"]]))
    # This machine has no headers for that kernel: the last refusal the plan makes, after the source was read.
    assert result["failed"] and "DKMS cannot build the nvidia module for 6.1.0-99-amd64" in result["msg"]
    assert "Nothing was changed" in result["msg"]


def test_a_source_signed_with_another_key_is_refused(tmp_path, repo):
    root, keys = repo
    result = run(tmp_path, mirror_args(root, [keys["good"]], tree="wrong-key"))
    assert result["failed"] and "apt could not read mirror source" in result["msg"]
    assert "NO_PUBKEY" in result["msg"] and "Nothing was changed" in result["msg"]


def test_a_key_with_an_untrusted_fingerprint_is_refused_before_apt_reads_the_source(tmp_path, repo):
    root, keys = repo
    result = run(tmp_path, mirror_args(root, None))
    assert result["failed"] and f"has the fingerprint(s) {keys['good']}" in result["msg"]
    assert "EB693B3035CD5710E231E123A4B469963BF863CC" in result["msg"]  # NVIDIA's, the default


def test_the_deprecated_single_fingerprint_still_works(tmp_path, repo):
    root, keys = repo
    result = run(tmp_path, mirror_args(root, None, repository_key_fingerprint=keys["good"]))
    # Past the key check, to the headers.
    assert "DKMS cannot build" in result["msg"]


def test_booleans_given_as_strings_are_booleans(tmp_path, repo):
    root, keys = repo
    args = mirror_args(root, [keys["good"]], manage_repository="false", headless="false", persistenced="False")
    result = run(tmp_path, args)
    # manage_repository false: no key is needed, the node's own lists are read (they have no branch 580 here);
    # headless false: the metapackage is the one looked for.
    assert result["failed"] and "mirror source has no cuda-drivers-580 in branch 580" in result["msg"]


def test_a_read_with_the_runs_checked_source_reads_neither_key_nor_source_again(tmp_path, repo):
    root, keys = repo
    offered = {
        name: ["580.95.05-1"]
        for name in ("nvidia-driver-pinning-580", "nvidia-driver-cuda", "nvidia-kernel-dkms", "nvidia-persistenced")
    }
    # A repository and a key URL that do not answer: a full read would stop there.
    args = mirror_args(
        root,
        [keys["good"]],
        tree="nowhere",
        repository_key_url=f"file://{root}/nowhere.pub",
        checked={"key": None, "offered": offered, "files": {}, "pci_gpus": []},
    )
    result = run(tmp_path, args, check=True)
    # The plan got as far as the kernels, from the offer handed over: no fetch, no apt update.
    assert result["failed"] and "DKMS cannot build the nvidia module for 6.1.0-99-amd64" in result["msg"]

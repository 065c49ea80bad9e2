# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubegpu.node.nvidia_driver_plan run by ansible-playbook against this machine (connection local): its argument
spec, its reads (the node read, the source check with real apt against the signed stand-in CUDA repository served as
file:// URLs, kubegpu.node.nvidia_pci_gpus), its refusals and its result, as the role sees them. This machine has no
driver and its running kernel has no headers; molecule/nvidia_driver* run it on nodes with DKMS builds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CUDA_PATH = "compute/cuda/repos/debian12/x86_64"

pytestmark = pytest.mark.skipif(
    not (shutil.which("apt-get") and Path("/usr/lib/apt/apt-helper").exists() and shutil.which("apt-ftparchive")),
    reason="needs apt, apt-helper and apt-ftparchive",
)


@pytest.fixture
def repo(cuda_repo):
    return cuda_repo


@pytest.fixture
def run(run_action):
    def plan(args: dict, check: bool = False) -> dict:
        return run_action("kubegpu.node.nvidia_driver_plan", args, check)

    return plan


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


def mirror(repo_root: Path, tree: str = "good") -> str:
    return f"file://{repo_root}/{tree}/{CUDA_PATH}/"


def test_a_full_read_plans_from_the_signed_source(run, repo):
    root, keys = repo
    result = run(mirror_args(root, [keys["good"]]))
    # This machine has no headers for that kernel: the last refusal the plan makes, after the source was read.
    assert result["failed"] and "DKMS cannot build the nvidia module for 6.1.0-99-amd64" in result["msg"]
    assert "Nothing was changed" in result["msg"]


def test_a_source_signed_with_another_key_is_refused(run, repo):
    root, keys = repo
    result = run(mirror_args(root, [keys["good"]], tree="wrong-key"))
    assert result["failed"] and "apt could not read mirror source" in result["msg"]
    assert "NO_PUBKEY" in result["msg"] and "Nothing was changed" in result["msg"]


def test_a_key_with_an_untrusted_fingerprint_is_refused_before_apt_reads_the_source(run, repo):
    root, keys = repo
    result = run(mirror_args(root, None))
    assert result["failed"] and f"has the fingerprint(s) {keys['good']}" in result["msg"]
    assert "EB693B3035CD5710E231E123A4B469963BF863CC" in result["msg"]  # NVIDIA's, the default


def test_the_deprecated_single_fingerprint_still_works(run, repo):
    root, keys = repo
    result = run(mirror_args(root, None, repository_key_fingerprint=keys["good"]))
    # Past the key check, to the headers.
    assert "DKMS cannot build" in result["msg"]


def test_booleans_given_as_strings_are_booleans(run, repo):
    root, keys = repo
    args = mirror_args(root, [keys["good"]], manage_repository="false", headless="false", persistenced="False")
    result = run(args)
    # manage_repository false: no key is needed, the node's own lists are read (they have no branch 580 here);
    # headless false: the metapackage is the one looked for.
    assert result["failed"] and "mirror source has no cuda-drivers-580 in branch 580" in result["msg"]


def test_a_read_with_the_runs_checked_source_reads_neither_key_nor_source_again(run, repo):
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
    result = run(args, check=True)
    # The plan got as far as the kernels, from the offer handed over: no fetch, no apt update.
    assert result["failed"] and "DKMS cannot build the nvidia module for 6.1.0-99-amd64" in result["msg"]

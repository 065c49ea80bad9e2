# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubegpu.node.nvidia_container_toolkit_plan run by ansible-playbook against this machine (connection local): the
key fetched with apt's own downloader, its fingerprint, the repository read by real apt in a throwaway state (the
signed stand-in toolkit repository, served as file:// URLs), the refusals and the plan. This machine has no toolkit;
molecule/nvidia_container_toolkit runs the role on Debian 11 and 12 nodes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not (shutil.which("apt-get") and Path("/usr/lib/apt/apt-helper").exists() and shutil.which("apt-ftparchive")),
    reason="needs apt, apt-helper and apt-ftparchive",
)


@pytest.fixture
def run(run_action, toolkit_repo, tmp_path):
    root, keys = toolkit_repo

    def plan(check: bool = True, tree: str = "good", **args) -> dict:
        base = {
            "repo_url": f"file://{root}/{tree}/libnvidia-container",
            "repo_key_url": f"file://{root}/good/libnvidia-container/gpgkey",
            "repo_key_fingerprints": [keys["good"]],
            "keyring": str(tmp_path / "k.asc"),
            "source": str(tmp_path / "x.sources"),
            **args,
        }
        return run_action("kubegpu.node.nvidia_container_toolkit_plan", base, check)

    plan.keys = keys
    return plan


def test_a_fresh_node_reads_the_repository_and_plans_all_four(run):
    result = run()
    assert not result.get("failed"), result.get("msg")
    assert result["packages"]["direction"] == "install"
    assert result["packages"]["install"][0] == "nvidia-container-toolkit=1.18.2-1"
    assert result["update_needed"] and result["checked"]["probed"]
    assert [f["changed"] for f in result["files"]] == [True, True]


def test_a_version_the_repository_lacks_is_refused_with_those_it_has(run):
    result = run(version="1.99.0-1")
    assert result["failed"] and "has no version 1.99.0-1" in result["msg"]
    assert "1.18.2-1, 1.18.1-1, 1.17.8-1" in result["msg"]


def test_a_repository_signed_with_another_key_is_refused(run):
    result = run(tree="wrong-key")
    assert result["failed"] and "apt refuses the NVIDIA Container Toolkit repository" in result["msg"]
    assert "NO_PUBKEY" in result["msg"]


def test_a_key_with_another_fingerprint_is_refused(run):
    result = run(repo_key_fingerprints=["0123456789ABCDEF0123456789ABCDEF01234567"])
    assert result["failed"] and f"has the fingerprint(s) {run.keys['good']}" in result["msg"]


def test_a_key_url_that_does_not_answer_is_refused(run, toolkit_repo):
    root, _keys = toolkit_repo
    result = run(repo_key_url=f"file://{root}/nothing")
    assert result["failed"] and "could not fetch the repository's signing key" in result["msg"]


def test_the_device_nodes_alone(run):
    result = run(links_only=True)
    assert not result.get("failed") and isinstance(result["unlinked"], list)

"""tools/build-ee.sh on a shared machine: it removes only the images this checkout built, never another checkout's.

podman and ansible-builder are stand-ins here (they record what they are asked); the build script, ansible-galaxy and
tools/collection_tarballs.py are real, run from a copy of the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
OTHER = "localhost/kubegpu-ee:0123456789abcdef"  # another checkout's build, same repository name

PODMAN = """#!/bin/sh
state=$STANDIN_STATE
echo "podman $*" >>"$state/calls"
case "$1 $2" in
  "image inspect") echo sha256:base ;;
  "image exists") grep -qx "$3" "$state/images" ;;
  "rmi "*) grep -vx "$2" "$state/images" >"$state/images.new"; mv "$state/images.new" "$state/images" ;;
  "images "*) cat "$state/images" ;;
  "tag "*) echo "$3" >>"$state/images" ;;
esac
"""
BUILDER = """#!/bin/sh
case "$1" in
  --version) echo 3.2.0 ;;
  build) while [ "$1" != --tag ]; do shift; done; echo "$2" >>"$STANDIN_STATE/images" ;;
esac
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    if shutil.which("ansible-galaxy") is None or not (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("needs the development environment (make venv)")
    root = tmp_path / "checkout"
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in files:
        source = REPO / name
        if source.is_file() and not source.is_symlink() and not name.startswith(("tests/", "molecule/", "bench/")):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    (root / ".venv").symlink_to(REPO / ".venv")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"podman": PODMAN, "ansible-builder": BUILDER}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    (state / "images").write_text(OTHER + "\n")
    return root


def _build(root: Path, certs: Path) -> str:
    state = root.parent / "state"
    env = dict(
        os.environ,
        PATH=f"{root.parent / 'bin'}:{os.environ['PATH']}",
        STANDIN_STATE=str(state),
        EE_EXTRA_CA_CERTS=str(certs),
        EE_BASE_IMAGE="localhost/kubegpu-node-test:bookworm",
    )
    run = subprocess.run(
        [str(root / "tools" / "build-ee.sh")], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()[-1]


def test_a_new_build_removes_this_checkouts_old_image_and_no_other(checkout: Path):
    certs = checkout.parent / "ca.crt"
    certs.write_text("first\n")
    first = _build(checkout, certs)
    certs.write_text("second\n")  # an input changed: a new image
    second = _build(checkout, certs)
    assert first != second
    images = (checkout.parent / "state" / "images").read_text().split()
    assert second in images and OTHER in images and first not in images
    assert (checkout / ".tmp" / "ee" / "built-images").read_text().split() == [second]
    calls = (checkout.parent / "state" / "calls").read_text()
    assert f"podman rmi {first}" in calls and f"rmi {OTHER}" not in calls


def test_the_base_image_comes_from_the_environment_not_the_definition(checkout: Path):
    certs = checkout.parent / "ca.crt"
    certs.write_text("x\n")
    _build(checkout, certs)
    built = (checkout / ".tmp" / "ee" / "definition" / "execution-environment.yml").read_text()
    assert "name: localhost/kubegpu-node-test:bookworm" in built
    # The example users copy builds from a public base, not this collection's test image.
    assert (
        "kubegpu-node-test"
        not in (REPO / "execution-environment" / "execution-environment.yml")
        .read_text()
        .split("name:", 1)[1]
        .splitlines()[0]
    )

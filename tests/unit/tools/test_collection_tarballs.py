"""tools/collection_tarballs.py: Galaxy tarballs of bundled collections that ansible-galaxy installs offline, with the
version bounds a collection declares enforced."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _load():
    spec = importlib.util.spec_from_file_location("collection_tarballs", REPO / "tools" / "collection_tarballs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tarballs = _load()

pytestmark = pytest.mark.skipif(shutil.which("ansible-galaxy") is None, reason="ansible-galaxy is not on PATH")


def _consumer(directory: Path, bound: str) -> Path:
    """A collection that depends on kubernetes.core within `bound`, built with ansible-galaxy."""
    source = directory / "src"
    source.mkdir()
    (source / "galaxy.yml").write_text(
        "namespace: consumer\nname: demo\nversion: 1.0.0\nreadme: README.md\nauthors: [t]\n"
        f"dependencies:\n  kubernetes.core: '{bound}'\n"
    )
    (source / "README.md").write_text("demo\n")
    subprocess.run(
        ["ansible-galaxy", "collection", "build", "--output-path", str(directory / "collections"), str(source)],
        check=True,
        capture_output=True,
    )
    return directory / "collections" / "consumer-demo-1.0.0.tar.gz"


def _install(directory: Path, tarball: Path) -> subprocess.CompletedProcess:
    core = tarballs.build_tarball(tarballs.bundled_collection("kubernetes.core"), directory / "collections")
    (directory / "requirements.yml").write_text(
        f"collections:\n  - {{name: collections/{tarball.name}, type: file}}\n"
        f"  - {{name: collections/{core.name}, type: file}}\n"
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(directory / "installed"), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="0")
    return subprocess.run(
        ["ansible-galaxy", "collection", "install", "--offline", "-r", "requirements.yml", "-p", "installed"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_bundled_dependency_installs_offline_within_its_bounds(tmp_path):
    installed = _install(tmp_path, _consumer(tmp_path, ">=6.0.0,<7.0.0"))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    core = tmp_path / "installed" / "ansible_collections" / "kubernetes" / "core"
    assert (core / "plugins" / "modules" / "k8s_drain.py").is_file()


def test_a_bound_the_bundled_version_misses_is_refused(tmp_path):
    installed = _install(tmp_path, _consumer(tmp_path, ">=99.0.0,<100.0.0"))
    assert installed.returncode != 0
    assert "kubernetes.core" in installed.stderr and ">=99.0.0" in installed.stderr


def test_files_the_package_left_out_are_dropped_from_the_manifest(tmp_path):
    (tmp_path / "collections").mkdir()
    tarball = tarballs.build_tarball(tarballs.bundled_collection("kubernetes.core"), tmp_path / "collections")
    with tarfile.open(tarball) as archive:
        names = set(archive.getnames())
    assert {"MANIFEST.json", "FILES.json", "plugins/modules/k8s.py"} <= names
    assert not any(name.startswith(".github") for name in names)

"""The signed stand-in repository builder and server (tests/aptrepo): what apt relies on is really there."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from aptrepo import build, serve

pytestmark = pytest.mark.skipif(
    not (shutil.which("apt-ftparchive") and shutil.which("dpkg-deb") and shutil.which("gpgv")),
    reason="needs apt-utils, dpkg and gpgv (tools/install-system-packages.sh)",
)

SPEC = """
key: {uid: test repo <repo@test.invalid>, publish: keys/gpgkey}
repositories:
  stable: {path: stable/deb/amd64, origin: tests}
  experimental: {path: experimental/deb/amd64}
defaults: {architecture: amd64}
packages:
  - name: demo-lib
    versions: ["1.0.0-1", "1.1.0-1"]
    repositories: [stable]
    depends: libc6
    files:
      - {path: /usr/lib/demo/lib.txt, content: "lib {upstream}\\n"}
      - {path: /usr/lib/demo/new.txt, content: "new\\n", min_version: "1.1.0"}
  - name: demo-tool
    versions: ["1.0.0-1", "1.1.0-1"]
    repositories: [stable]
    depends: demo-lib (= {version})
    files:
      - {path: /usr/bin/demo, source: demo.sh, mode: "0755"}
  - name: demo-tool
    versions: ["2.0.0~rc.1-1"]
    repositories: [experimental]
    files: []
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    work = tmp_path_factory.mktemp("aptrepo")
    (work / "spec.yml").write_text(SPEC, encoding="utf-8")
    (work / "demo.sh").write_text("#!/bin/sh\necho demo {version}\n", encoding="utf-8")
    out = work / "out"
    return out, build.build(work / "spec.yml", out)


def _gpgv(keyring_asc: Path, inrelease: Path, tmp: Path) -> subprocess.CompletedProcess[bytes]:
    keyring = tmp / (keyring_asc.stem + ".gpg")
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(keyring_asc)], check=True)
    return subprocess.run(["gpgv", "--keyring", str(keyring), str(inrelease)], capture_output=True, check=False)


def test_packages_index_lists_each_version_in_its_repository(built: tuple[Path, dict[str, str]]) -> None:
    out, _ = built
    stable = (out / "good/stable/deb/amd64/Packages").read_text(encoding="utf-8")
    experimental = (out / "good/experimental/deb/amd64/Packages").read_text(encoding="utf-8")
    assert stable.count("Package: demo-lib\n") == 2
    assert "Version: 2.0.0~rc.1-1" not in stable
    assert "Version: 2.0.0~rc.1-1" in experimental
    assert "Depends: demo-lib (= 1.1.0-1)" in stable


def test_file_contents_versions_and_ranges(built: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    out, _ = built
    for version, has_new in (("1.0.0-1", False), ("1.1.0-1", True)):
        dest = tmp_path / version
        subprocess.run(["dpkg-deb", "-x", str(out / f"debs/demo-lib_{version}_amd64.deb"), str(dest)], check=True)
        assert (dest / "usr/lib/demo/lib.txt").read_text() == f"lib {version[:-2]}\n"
        assert (dest / "usr/lib/demo/new.txt").exists() is has_new
    tool = tmp_path / "tool"
    subprocess.run(["dpkg-deb", "-x", str(out / "debs/demo-tool_1.1.0-1_amd64.deb"), str(tool)], check=True)
    assert (tool / "usr/bin/demo").stat().st_mode & 0o777 == 0o755
    assert "echo demo 1.1.0-1" in (tool / "usr/bin/demo").read_text()


def test_good_tree_verifies_with_the_published_key_only(built: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    out, keys = built
    inrelease = out / "good/stable/deb/amd64/InRelease"
    assert _gpgv(out / "good/keys/gpgkey", inrelease, tmp_path).returncode == 0
    assert _gpgv(out / "wrong.asc", inrelease, tmp_path).returncode != 0
    assert keys["good"] != keys["wrong"]
    assert (out / "keys.json").read_text(encoding="utf-8") == json.dumps(keys, indent=2) + "\n"


def test_wrong_key_tree_publishes_the_good_key_but_is_signed_with_another(
    built: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    out, _ = built
    assert (out / "wrong-key/keys/gpgkey").read_bytes() == (out / "good.asc").read_bytes()
    inrelease = out / "wrong-key/stable/deb/amd64/InRelease"
    assert _gpgv(out / "good.asc", inrelease, tmp_path).returncode != 0
    assert _gpgv(out / "wrong.asc", inrelease, tmp_path).returncode == 0
    assert (out / "current").resolve() == (out / "good").resolve()


def test_spec_errors_are_reported() -> None:
    with pytest.raises(build.SpecError, match="unknown repositories"):
        build.expand_packages(
            {"repositories": {"a": {}}, "packages": [{"name": "x", "version": "1", "repositories": ["b"]}]}
        )
    with pytest.raises(build.SpecError, match="needs a name"):
        build.expand_packages({"repositories": {"a": {}}, "packages": [{"name": "x"}]})


def test_server_serves_logs_and_stops(built: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    out, _ = built
    state = tmp_path / "state"
    info = serve.start(out, "127.0.0.1", state, 60)
    try:
        url = f"http://127.0.0.1:{info['port']}/current/stable/deb/amd64/InRelease"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.read() == (out / "good/stable/deb/amd64/InRelease").read_bytes()
        assert "GET /current/stable/deb/amd64/InRelease 200" in (state / "requests.log").read_text(encoding="utf-8")
    finally:
        assert serve.stop(state) is True
    assert serve.stop(state) is False

"""Build signed flat Debian repositories of stand-in packages from a spec (YAML or JSON).

The spec (see specs/nvidia-container-toolkit.yml for a full one)::

    key:
      uid: kubegpu test repository <repo@test.invalid>   # the throwaway keys' user id
      publish: gpgkey                  # where each tree carries the good key, ASCII-armoured (as NVIDIA's gpgkey)
    repositories:                      # flat repositories (apt: "Suites: /"), one folder each in every tree
      stable: {path: stable/deb/amd64, origin: NVIDIA, label: NVIDIA CORPORATION}
    defaults: {architecture: amd64, maintainer: ..., section: utils}
    packages:
      - name: libnvidia-container1
        versions: ["1.17.8-1", "1.18.2-1"]
        repositories: [stable]
        depends: libc6                 # also pre_depends, recommends, breaks, replaces, conflicts, provides
        description: One line, then more lines if needed
        files:
          - {path: /usr/bin/tool, source: files/tool, mode: "0755"}   # source: relative to the spec file
          - {path: /etc/tool.conf, content: "x = 1\n", conffile: true}
          - {path: /usr/lib/libx.so, link: libx.so.1}
          - {path: /lib/systemd/system/x.service, content: ..., min_version: "1.18.0"}
        scripts: {postinst: "#!/bin/sh\n...", prerm: ..., postrm: ..., preinst: ...}

In every text (depends, contents, sources, scripts) {name}, {version} (the Debian version, 1.18.2-1) and
{upstream} (1.18.2) are replaced. A file with min_version / max_version is packaged only in the versions in that
range (dpkg's version order).

The output folder gets:

    debs/                 every package built once
    good/<path>/          each repository: the debs, Packages(.gz), Release, InRelease, Release.gpg, signed with
                          the good key; good/<publish> the good public key
    wrong-key/<path>/     the same repositories signed with another key, still publishing the good key at <publish>
                          (what a repository whose signing key was replaced looks like to a client that pinned
                          the good one)
    current -> good       a link a test can turn to wrong-key (a key change after an earlier good update)
    good.asc, wrong.asc   both public keys
    keys.json             {"good": FINGERPRINT, "wrong": FINGERPRINT, "uid": ...}
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

CONTROL_FIELDS = {
    "pre_depends": "Pre-Depends",
    "depends": "Depends",
    "recommends": "Recommends",
    "breaks": "Breaks",
    "replaces": "Replaces",
    "conflicts": "Conflicts",
    "provides": "Provides",
}
SCRIPTS = ("preinst", "postinst", "prerm", "postrm")


class SpecError(ValueError):
    """The spec is not one this builder understands."""


def load_spec(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        spec = json.loads(text)
    else:
        import yaml  # the controller's virtual environment has PyYAML (ansible-core needs it)

        spec = yaml.safe_load(text)
    if not isinstance(spec, dict) or not spec.get("packages") or not spec.get("repositories"):
        raise SpecError(f"{path}: a spec needs 'repositories' and 'packages'")
    return spec


def substitute(text: str, name: str, version: str) -> str:
    upstream = version.rsplit("-", 1)[0] if "-" in version else version
    return text.replace("{name}", name).replace("{version}", version).replace("{upstream}", upstream)


def version_compare(a: str, op: str, b: str) -> bool:
    return subprocess.run(["dpkg", "--compare-versions", a, op, b], check=False).returncode == 0


def expand_packages(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per (name, version), with the spec's defaults filled in."""
    defaults = spec.get("defaults") or {}
    known_repos = set(spec["repositories"])
    result = []
    for entry in spec["packages"]:
        versions = entry.get("versions") or ([entry["version"]] if "version" in entry else [])
        if not entry.get("name") or not versions:
            raise SpecError(f"package entry {entry!r} needs a name and version(s)")
        repos = entry.get("repositories") or sorted(known_repos)
        unknown = set(repos) - known_repos
        if unknown:
            raise SpecError(f"package {entry['name']} names unknown repositories {sorted(unknown)}")
        for version in versions:
            package = {**defaults, **entry, "version": str(version), "repositories": list(repos)}
            package.pop("versions", None)
            result.append(package)
    return result


def control_text(package: dict[str, Any], installed_kb: int) -> str:
    name, version = package["name"], package["version"]
    description = substitute(package.get("description") or f"stand-in {name} (tests only)", name, version)
    summary, _, rest = description.strip().partition("\n")
    lines = [
        f"Package: {name}",
        f"Version: {version}",
        f"Architecture: {package.get('architecture', 'all')}",
        f"Maintainer: {package.get('maintainer', 'kubegpu.node tests <tests@test.invalid>')}",
        f"Installed-Size: {installed_kb}",
        f"Section: {package.get('section', 'misc')}",
        f"Priority: {package.get('priority', 'optional')}",
    ]
    for key, field in CONTROL_FIELDS.items():
        if package.get(key):
            lines.append(f"{field}: {substitute(str(package[key]), name, version)}")
    lines.append(f"Description: {summary}")
    lines.extend(" " + (line if line.strip() else ".") for line in rest.splitlines())
    return "\n".join(lines) + "\n"


def build_deb(package: dict[str, Any], spec_dir: Path, debs: Path) -> Path:
    name, version = package["name"], package["version"]
    with tempfile.TemporaryDirectory(prefix="aptrepo-deb-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        debian = root / "DEBIAN"
        debian.mkdir()
        conffiles = []
        for item in package.get("files") or []:
            if "min_version" in item and not version_compare(version, "ge", str(item["min_version"])):
                continue
            if "max_version" in item and not version_compare(version, "le", str(item["max_version"])):
                continue
            target = root / item["path"].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if "link" in item:
                target.symlink_to(item["link"])
                continue
            if "source" in item:
                text = (spec_dir / item["source"]).read_text(encoding="utf-8")
            else:
                text = str(item.get("content", ""))
            target.write_text(substitute(text, name, version), encoding="utf-8")
            target.chmod(int(str(item.get("mode", "0644")), 8))
            if item.get("conffile"):
                conffiles.append(item["path"])
        if conffiles:
            (debian / "conffiles").write_text("".join(f"{p}\n" for p in conffiles), encoding="utf-8")
        for script in SCRIPTS:
            body = (package.get("scripts") or {}).get(script)
            if body:
                path = debian / script
                path.write_text(substitute(body, name, version), encoding="utf-8")
                path.chmod(0o755)
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        (debian / "control").write_text(control_text(package, max(1, size // 1024)), encoding="utf-8")
        arch = package.get("architecture", "all")
        deb = debs / f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return deb


class Gpg:
    """A throwaway gpg home with one signing key."""

    def __init__(self, home: Path, uid: str) -> None:
        self.home = home
        home.mkdir(mode=0o700)
        self._run(["--quick-generate-key", uid, "ed25519", "sign", "never"])
        listing = self._run(["--with-colons", "--list-secret-keys"]).stdout
        self.fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))

    def _run(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        base = ["gpg", "--homedir", str(self.home), "--batch", "--yes", "--pinentry-mode", "loopback"]
        return subprocess.run([*base, "--passphrase", "", *args], check=True, capture_output=True, text=True)

    def export(self, dest: Path) -> None:
        dest.write_text(self._run(["--armor", "--export", self.fingerprint]).stdout, encoding="utf-8")

    def sign(self, release: Path) -> None:
        key = ["--local-user", self.fingerprint, "--digest-algo", "SHA512"]
        self._run([*key, "--clearsign", "--output", str(release.parent / "InRelease"), str(release)])
        self._run([*key, "--armor", "--detach-sign", "--output", str(release.parent / "Release.gpg"), str(release)])

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.home), "--kill", "all"], check=False, capture_output=True)


def index_repository(folder: Path, repo: dict[str, Any], signer: Gpg) -> None:
    packages = subprocess.run(
        ["apt-ftparchive", "packages", "."], cwd=folder, check=True, capture_output=True, text=True
    ).stdout
    (folder / "Packages").write_text(packages, encoding="utf-8")
    with gzip.open(folder / "Packages.gz", "wt", encoding="utf-8") as fh:
        fh.write(packages)
    options = []
    for key in ("origin", "label", "suite", "codename", "description"):
        if repo.get(key):
            options += ["-o", f"APT::FTPArchive::Release::{key.capitalize()}={repo[key]}"]
    release = subprocess.run(
        ["apt-ftparchive", *options, "release", "."], cwd=folder, check=True, capture_output=True, text=True
    ).stdout
    (folder / "Release").write_text(release, encoding="utf-8")
    signer.sign(folder / "Release")


def build(spec_path: Path, out: Path) -> dict[str, str]:
    """Build every tree of the spec into ``out`` (replaced); returns keys.json's content."""
    spec = load_spec(spec_path)
    packages = expand_packages(spec)
    uid = (spec.get("key") or {}).get("uid", "kubegpu test repository <repo@test.invalid>")
    publish = (spec.get("key") or {}).get("publish", "gpgkey")
    if out.exists():
        shutil.rmtree(out)
    (out / "debs").mkdir(parents=True)
    built = [(package, build_deb(package, spec_path.parent, out / "debs")) for package in packages]
    with tempfile.TemporaryDirectory(prefix="aptrepo-gpg-", dir="/tmp") as tmp:
        good = Gpg(Path(tmp) / "good", uid)
        wrong = Gpg(Path(tmp) / "wrong", uid.replace("<", "(another key) <", 1))
        try:
            good.export(out / "good.asc")
            wrong.export(out / "wrong.asc")
            for tree, signer in (("good", good), ("wrong-key", wrong)):
                for repo_name, repo in spec["repositories"].items():
                    folder = out / tree / repo["path"].strip("/")
                    folder.mkdir(parents=True, exist_ok=True)
                    for package, deb in built:
                        if repo_name in package["repositories"]:
                            os.link(deb, folder / deb.name)
                    index_repository(folder, repo, signer)
                key_dest = out / tree / publish
                key_dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(out / "good.asc", key_dest)
            keys = {"good": good.fingerprint, "wrong": wrong.fingerprint, "uid": uid, "publish": publish}
        finally:
            good.close()
            wrong.close()
    (out / "current").symlink_to("good")
    (out / "keys.json").write_text(json.dumps(keys, indent=2) + "\n", encoding="utf-8")
    return keys

"""Galaxy tarballs of the collections galaxy.yml depends on, and a requirements.yml that installs them offline.

Ansible Galaxy cannot be reached from CI, so the dependencies come from the copies bundled in the pinned `ansible`
package (an installed collection keeps MANIFEST.json and FILES.json, which is all a Galaxy tarball is besides the
files; `ansible-galaxy collection install` checks every file against FILES.json). The version bounds are not checked
here: `ansible-galaxy collection install` must refuse a bundled version outside them, which is the point of the test.

    collection_tarballs.py DIR [COLLECTION_TARBALL]

writes DIR/collections/<namespace>-<name>-<version>.tar.gz for each dependency and DIR/requirements.yml listing them
(and COLLECTION_TARBALL first, when given, which must lie in DIR) as `type: file` entries relative to DIR: run
`ansible-galaxy collection install -r requirements.yml --offline` from DIR.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def declared_dependencies(galaxy_yml: Path) -> dict[str, str]:
    """galaxy.yml's `dependencies`: FQCN -> version range."""
    data = yaml.safe_load(galaxy_yml.read_text(encoding="utf-8")) or {}
    return {str(name): str(bound) for name, bound in (data.get("dependencies") or {}).items()}


def bundled_collection(fqcn: str) -> Path:
    """The installed copy of a collection in the `ansible` package's ansible_collections folder."""
    # The `ansible` package's namespace package, found on sys.path (imported late: only this needs it).
    import ansible_collections

    namespace, name = fqcn.split(".", 1)
    for base in ansible_collections.__path__:
        candidate = Path(base, namespace, name)
        if (candidate / "MANIFEST.json").is_file():
            return candidate
    raise SystemExit(f"{fqcn} is declared in galaxy.yml but not bundled in the installed `ansible` package")


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(data))


def build_tarball(source: Path, outdir: Path) -> Path:
    """Pack an installed collection as a Galaxy tarball.

    The `ansible` package leaves out part of each collection (tests, docs, CI files) but keeps the original FILES.json,
    so the manifest is rewritten to list what is there, each file's checksum checked against the original entry.
    """
    manifest = json.loads((source / "MANIFEST.json").read_text(encoding="utf-8"))
    files = json.loads((source / "FILES.json").read_text(encoding="utf-8"))
    present = []
    for entry in files["files"]:
        path = source / entry["name"]
        if entry["name"] == "." or not path.exists():
            if entry["name"] == ".":
                present.append(entry)
            continue
        if entry["ftype"] == "file":
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest != entry["chksum_sha256"]:
                raise SystemExit(f"{path} differs from its FILES.json checksum: the bundled copy was modified")
        present.append(entry)
    files_json = json.dumps(dict(files, files=present), indent=4).encode()
    manifest["file_manifest_file"]["chksum_sha256"] = hashlib.sha256(files_json).hexdigest()
    info = manifest["collection_info"]
    target = outdir / f"{info['namespace']}-{info['name']}-{info['version']}.tar.gz"
    with tarfile.open(target, "w:gz") as archive:
        _add_bytes(archive, "MANIFEST.json", json.dumps(manifest, indent=4).encode())
        _add_bytes(archive, "FILES.json", files_json)
        for entry in present:
            if entry["name"] == ".":
                continue
            member = archive.gettarinfo(source / entry["name"], arcname=entry["name"])
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            if member.isfile():
                with open(source / entry["name"], "rb") as handle:
                    archive.addfile(member, handle)
            else:
                archive.addfile(member)
    return target


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    directory = Path(argv[1]).resolve()
    outdir = directory / "collections"
    outdir.mkdir(parents=True, exist_ok=True)
    tarballs = [build_tarball(bundled_collection(fqcn), outdir) for fqcn in declared_dependencies(ROOT / "galaxy.yml")]
    if len(argv) == 3:
        tarballs.insert(0, Path(argv[2]).resolve())
    entries = [{"name": str(t.relative_to(directory)), "type": "file"} for t in tarballs]
    (directory / "requirements.yml").write_text(
        yaml.safe_dump({"collections": entries}, explicit_start=True, sort_keys=False), encoding="utf-8"
    )
    for tarball in tarballs:
        print(tarball.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

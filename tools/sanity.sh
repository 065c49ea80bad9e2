#!/usr/bin/env bash
# ansible-test sanity needs the collection at ansible_collections/<namespace>/<name>: run it from a fresh copy of the
# files git knows about (tracked, plus new files not ignored), so caches and virtual environments stay out.
# --venv builds each test's requirements into ansible-test's own virtual environments (from PyPI); no ignore files.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python_version=${SANITY_PYTHON:-$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/kubegpu/node"
mkdir -p "$dest"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} cp --parents {} "$dest/" 2>/dev/null || true)
# ansible-test reads the file list from git when there is a repository; give it one with exactly these files.
(cd "$dest" && git init -q && git add -A && git -c user.email=ci@localhost -c user.name=ci commit -qm sanity)
if ls "$dest"/tests/sanity/ignore-*.txt >/dev/null 2>&1; then
  echo "tests/sanity/ignore-*.txt exists: this collection keeps no sanity ignore entries" >&2
  exit 1
fi
cd "$dest"
export ANSIBLE_COLLECTIONS_PATH="$work"
"$root/.venv/bin/ansible-test" sanity --venv --python "$python_version" --color no "$@"

#!/usr/bin/env bash
# ansible-test sanity needs the collection at ansible_collections/<namespace>/<name>: run it from a fresh copy of the
# files git knows about (tracked, plus new files not ignored), so caches and virtual environments stay out.
# --venv builds each test's requirements into ansible-test's own virtual environments (from PyPI); no ignore files.
# SANITY_VENV=/path/to/venv runs another ansible-core's ansible-test (the oldest one meta/runtime.yml claims, say).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SANITY_VENV:-$root/.venv}
python_version=${SANITY_PYTHON:-$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/kubegpu/node"
mkdir -p "$dest"
# Files deleted from the work tree but still in the index are skipped. collections/ is not collection content (it is
# in galaxy.yml's build_ignore, and tools/check-build.sh checks no tarball has it): it holds the link through which a
# plain clone finds the repository as kubegpu.node, a directory link that content may not have.
(cd "$root" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  case "$f" in collections/*) continue ;; esac
  if [ -e "$f" ]; then cp --parents -P "$f" "$dest/"; fi
done)
# ansible-test reads the file list from git when there is a repository; give it one with exactly these files.
(cd "$dest" && git init -q && git add -A && git -c user.email=ci@localhost -c user.name=ci commit -qm sanity)
if ls "$dest"/tests/sanity/ignore-*.txt >/dev/null 2>&1; then
  echo "tests/sanity/ignore-*.txt exists: this collection keeps no sanity ignore entries" >&2
  exit 1
fi
# ansible-test bootstraps pip in its venvs with a script from a host CI cannot reach: give it a local one instead.
pip_version=$("$venv/bin/python" -c '
from ansible_test._internal.python_requirements import get_venv_packages
class Python:
    version = "'"$python_version"'"
print(get_venv_packages(Python())["pip"])')
cache="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
mkdir -p "$(dirname "$cache")"
cp "$root/tools/ansible-test-get-pip.py" "$cache"
cd "$dest"
export ANSIBLE_COLLECTIONS_PATH="$work"
"$venv/bin/ansible-test" sanity --venv --python "$python_version" --color no "$@"

#!/usr/bin/env bash
# Builds the Galaxy tarball, checks that no development file is in it, installs it into an empty collections path
# and calls its roles, modules and playbook by their fully qualified names from there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"
ansible-galaxy collection build --force --output-path "$work/dist" >/dev/null
tarball=$(ls "$work"/dist/kubegpu-node-*.tar.gz)
echo "built $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KiB)"

tar -tzf "$tarball" >"$work/contents"
leaked=$(grep -E '^(molecule|tests|bench|demo|tools|requirements|\.ci|\.venv|\.tmp|\.git)(/|$)|__pycache__|\.pyc$|\.pytest_cache|\.ruff_cache' "$work/contents" || true)
if [ -n "$leaked" ]; then
  echo "development files in the tarball:" >&2
  echo "$leaked" >&2
  exit 1
fi
for must in MANIFEST.json FILES.json LICENSE README.md meta/runtime.yml playbooks/site.yml \
    roles/container_runtime/meta/argument_specs.yml; do
  grep -qx "$must" "$work/contents" || { echo "$must is missing from the tarball" >&2; exit 1; }
done

# Install into a path of its own, and see only that path and the dependencies (kubernetes.core, from the collections
# the ansible package bundles, as users get it): the result must not lean on the source tree (whose development link
# would otherwise count as "already installed"). Galaxy is not reachable, so dependencies are not fetched.
unset PYTHONPATH
bundled=$(python3 -c 'import ansible_collections.kubernetes.core as c, os; print(c.__path__[0].rsplit("/ansible_collections/", 1)[0])')
[ -d "$bundled/ansible_collections/kubernetes/core" ] || { echo "kubernetes.core is not installed (the ansible package bundles it)" >&2; exit 1; }
export ANSIBLE_COLLECTIONS_PATH="$work/installed:$bundled" ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=false
ansible-galaxy collection install --offline --no-deps --force "$tarball" -p "$work/installed" >/dev/null
[ -f "$work/installed/ansible_collections/kubegpu/node/MANIFEST.json" ] || { echo "the tarball did not install" >&2; exit 1; }
cd "$work"
ansible-doc -t role kubegpu.node.container_runtime >/dev/null
for path in "$root"/plugins/modules/*.py; do
  [ -e "$path" ] || continue
  module=$(basename "$path" .py)
  ansible-doc -t module "kubegpu.node.$module" >/dev/null
done
ansible-doc -t filter kubegpu.node.docker_daemon_config >/dev/null
ansible-doc -t filter kubegpu.node.gpu_labels >/dev/null
ansible-doc -t filter kubegpu.node.gpu_validation_table >/dev/null
ansible-playbook kubegpu.node.site --syntax-check -i localhost, >/dev/null
echo "installed collection: roles, modules and kubegpu.node.site resolve by FQCN"

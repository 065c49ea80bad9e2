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
    roles/container_runtime/meta/argument_specs.yml roles/nvidia_driver/meta/argument_specs.yml; do
  grep -qx "$must" "$work/contents" || { echo "$must is missing from the tarball" >&2; exit 1; }
done

# Install into a path of its own, and see only that path: the result must not lean on the source tree (whose
# development link would otherwise count as "already installed").
export ANSIBLE_COLLECTIONS_PATH="$work/installed" ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=false
unset PYTHONPATH
ansible-galaxy collection install --offline --force "$tarball" -p "$work/installed" >/dev/null
[ -f "$work/installed/ansible_collections/kubegpu/node/MANIFEST.json" ] || { echo "the tarball did not install" >&2; exit 1; }
cd "$work"
ansible-doc -t role kubegpu.node.container_runtime >/dev/null
ansible-doc -t role kubegpu.node.nvidia_driver >/dev/null
for path in "$root"/plugins/modules/*.py; do
  [ -e "$path" ] || continue
  module=$(basename "$path" .py)
  ansible-doc -t module "kubegpu.node.$module" >/dev/null
done
ansible-doc -t filter kubegpu.node.docker_daemon_config >/dev/null
for filter in nvidia_smi_gpus nvidia_driver_packages nvidia_driver_reboot; do
  ansible-doc -t filter "kubegpu.node.$filter" >/dev/null
done
ansible-playbook kubegpu.node.site --syntax-check -i localhost, >/dev/null
echo "installed collection: roles, modules and kubegpu.node.site resolve by FQCN"

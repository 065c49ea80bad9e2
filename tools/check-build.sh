#!/usr/bin/env bash
# Builds the Galaxy tarball, checks that no development file is in it, installs it into an empty collections path
# and calls its roles, modules and playbook by their fully qualified names from there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"
ansible-galaxy collection build --force --output-path "$work/dist/collections" >/dev/null
tarball=$(ls "$work"/dist/collections/kubegpu-node-*.tar.gz)
echo "built $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KiB)"

tar -tzf "$tarball" >"$work/contents"
leaked=$(grep -E '^(molecule|tests|bench|demo|tools|requirements|collections|execution-environment|examples|ansible\.cfg|\.ci|\.venv|\.tmp|\.git)(/|$)|__pycache__|\.pyc$|\.pytest_cache|\.ruff_cache' "$work/contents" || true)
if [ -n "$leaked" ]; then
  echo "development files in the tarball:" >&2
  echo "$leaked" >&2
  exit 1
fi
for must in MANIFEST.json FILES.json LICENSE README.md meta/runtime.yml meta/execution-environment.yml requirements.txt playbooks/site.yml \
    roles/container_runtime/meta/argument_specs.yml; do
  grep -qx "$must" "$work/contents" || { echo "$must is missing from the tarball" >&2; exit 1; }
done

# Install into a path of its own, and see only that path: the result must not lean on the source tree (whose
# development link would otherwise count as "already installed"). The dependencies galaxy.yml declares come as
# tarballs of the copies bundled in the pinned `ansible` package (Galaxy cannot be reached): ansible-galaxy must
# resolve them, version bounds included, from those alone.
"$root/.venv/bin/python" "$root/tools/collection_tarballs.py" "$work/dist" "$tarball" >/dev/null
export ANSIBLE_COLLECTIONS_PATH="$work/installed" ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=false
unset PYTHONPATH
(cd "$work/dist" && ansible-galaxy collection install --offline -r requirements.yml -p "$work/installed" >/dev/null)
[ -f "$work/installed/ansible_collections/kubegpu/node/MANIFEST.json" ] || { echo "the tarball did not install" >&2; exit 1; }
"$root/.venv/bin/python" - "$root/galaxy.yml" "$work/installed" <<'PY'
import sys
from pathlib import Path

import yaml

wanted = (yaml.safe_load(Path(sys.argv[1]).read_text()) or {}).get("dependencies") or {}
missing = [fqcn for fqcn in wanted if not Path(sys.argv[2], "ansible_collections", *fqcn.split("."), "MANIFEST.json").is_file()]
if missing:
    sys.exit(f"declared dependencies not installed with the collection: {', '.join(missing)}")
PY
cd "$work"
# Every public role, by its fully qualified name: its documentation, and a play that applies it. Internal roles
# (roles/_*, the node layer the others import) have neither, and must be in the tarball.
roles=()
for dir in "$root"/roles/*/; do
  role=$(basename "$dir")
  case "$role" in
    _*) grep -qx "roles/$role/tasks/.*\.yml" "$work/contents" || { echo "the internal role $role is missing" >&2; exit 1; } ;;
    *) roles+=("$role") ;;
  esac
done
for role in "${roles[@]}"; do
  ansible-doc -t role "kubegpu.node.$role" >/dev/null
  printf -- '- name: Apply %s\n  hosts: all\n  roles:\n    - kubegpu.node.%s\n' "$role" "$role" >"$work/role-$role.yml"
  ansible-playbook "$work/role-$role.yml" --syntax-check -i localhost, >/dev/null
done
for path in "$root"/plugins/modules/*.py; do
  [ -e "$path" ] || continue
  module=$(basename "$path" .py)
  ansible-doc -t module "kubegpu.node.$module" >/dev/null
done
for path in "$root"/plugins/filter/*.yml; do
  [ -e "$path" ] || continue
  ansible-doc -t filter "kubegpu.node.$(basename "$path" .yml)" >/dev/null
done
printf 'gpu_nodes:\n  hosts:\n    gpu-1:\n' >"$work/inventory.yml"
ansible-playbook kubegpu.node.site --syntax-check -i "$work/inventory.yml" >/dev/null
ansible-playbook kubegpu.node.site --list-tasks -i "$work/inventory.yml" >"$work/site-tasks"
# site.yml includes its roles dynamically (include_role), so --list-tasks names the include tasks, not the roles' own.
installed_site=$(find "$work/installed" -path '*/ansible_collections/kubegpu/node/playbooks/site.yml' | head -n 1)
for role in "${roles[@]}"; do
  # site.yml itself, or a task file of its own that it includes (playbooks/tasks/, e.g. tasks/gpu_health.yml).
  grep -q "name: kubegpu.node.$role\$" "$installed_site" "$(dirname "$installed_site")"/tasks/*.yml \
    || { echo "kubegpu.node.site does not run the role $role" >&2; exit 1; }
done
echo "installed collection ($(find "$work/dist/collections" -name "*.tar.gz" | wc -l) tarballs): ${#roles[@]} roles, modules and kubegpu.node.site resolve by FQCN"

# A plain clone: ansible-playbook playbooks/site.yml from the repository root finds the collection through ansible.cfg
# (collections_path) and the link collections/ansible_collections/kubegpu/node, with no collections path set.
clone="$work/clone"
mkdir -p "$clone"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  if [ -e "$f" ] || [ -L "$f" ]; then cp --parents -P "$f" "$clone/"; fi
done)
unset ANSIBLE_COLLECTIONS_PATH ANSIBLE_COLLECTIONS_SCAN_SYS_PATH
(cd "$clone" && HOME="$work/home" ansible-playbook playbooks/site.yml -i inventory/example.yml --list-tasks >"$work/clone-tasks") || {
  echo "a plain clone cannot run playbooks/site.yml:" >&2; cat "$work/clone-tasks" >&2; exit 1; }
# Its preflight play imports each role's preflight (listed); the batch includes the roles in tasks/chain.yml.
for step in "Preflight of the container runtime role" "Run the steps of the role chain that have anything to do"; do
  grep -q "$step" "$work/clone-tasks" || { echo "the clone's site.yml lists no role step ($step)" >&2; exit 1; }
done
# The roles site.yml includes resolve in the clone through ansible.cfg alone.
for role in "${roles[@]}"; do
  (cd "$clone" && HOME="$work/home" ansible-doc -t role "kubegpu.node.$role" >/dev/null) || {
    echo "a plain clone does not find the role kubegpu.node.$role" >&2; exit 1; }
done
echo "plain clone: ansible-playbook playbooks/site.yml finds the collection (ansible.cfg)"

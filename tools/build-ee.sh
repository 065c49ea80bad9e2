#!/usr/bin/env bash
# Builds the execution environment (execution-environment/execution-environment.yml) with ansible-builder 3 and podman,
# from this checkout, and tags it with a hash of everything that goes into it: an image whose inputs did not change
# is not built again. The last line printed is the image's name.
#   tools/build-ee.sh
# Environment:
#   EE_EXTRA_CA_CERTS  a folder (its *.crt files) or one PEM file of CA certificates the build must trust, for a
#                      TLS-intercepting proxy between the build and PyPI. Default: /usr/local/share/ca-certificates,
#                      where a Debian machine keeps the local certificates update-ca-certificates adds. "" for none.
#   EE_BASE_IMAGE      the base image to build from instead of the definition's images.base_image.name (this
#                      collection's CI, which reaches no registry, builds from its local Debian 12 test image).
#   EE_IMAGE           the image's repository name (default kubegpu-ee); the tag is the inputs' hash.
#   EE_TAG             an extra tag to put on the result (for example kubegpu-ee:latest), cached or not.
#   EE_NO_CACHE=1      build even when the image exists, and without podman's layer cache (a cold build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work="$root/.tmp/ee"
definition="$work/definition"
image_name=${EE_IMAGE:-kubegpu-ee}
extra_ca=${EE_EXTRA_CA_CERTS-/usr/local/share/ca-certificates}
# The podman settings these machines need (runc, explicit ulimits) also apply to the build's RUN steps.
export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/tools/containers.conf}
cd "$root"

# The images this checkout built (one a line): the only ones it removes when a newer build replaces them. Another
# checkout on the same machine builds the same repository name, and keeps its own record.
record="$work/built-images"

rm -rf "$definition"
mkdir -p "$definition/collections" "$definition/extra-ca-certs"
cp execution-environment/execution-environment.yml "$definition/"
if [ -n "${EE_BASE_IMAGE:-}" ]; then
  "$root/.venv/bin/python" - "$definition/execution-environment.yml" "$EE_BASE_IMAGE" <<'PY'
import sys
from pathlib import Path

import yaml

path = Path(sys.argv[1])
definition = yaml.safe_load(path.read_text())
definition["images"]["base_image"]["name"] = sys.argv[2]
path.write_text(yaml.safe_dump(definition, sort_keys=False))
PY
fi

ansible-galaxy collection build --force --output-path "$definition/collections" "$root" >/dev/null
collection=$(ls "$definition"/collections/kubegpu-node-*.tar.gz)
"$root/.venv/bin/python" "$root/tools/collection_tarballs.py" "$definition" "$collection" >/dev/null

if [ -n "$extra_ca" ]; then
  if [ -d "$extra_ca" ]; then
    find "$extra_ca" -maxdepth 1 -name '*.crt' -exec cp {} "$definition/extra-ca-certs/" ';'
  elif [ -f "$extra_ca" ]; then
    cp "$extra_ca" "$definition/extra-ca-certs/extra-ca.crt"
  else
    echo "EE_EXTRA_CA_CERTS=$extra_ca is neither a folder nor a file" >&2
    exit 1
  fi
fi

base=$("$root/.venv/bin/python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["images"]["base_image"]["name"])' \
  "$definition/execution-environment.yml")
base_id=$(podman image inspect --format '{{.Id}}' "$base" 2>/dev/null) || {
  echo "the base image $base is not in podman: run \`make images\`, or change images.base_image.name" >&2
  exit 1
}

# What the image is made of: the definition, the requirements, each collection's MANIFEST.json (which holds the
# checksum of FILES.json, so of every file; tarballs themselves carry build times), the certificates, the base image
# and the builder's version.
inputs_hash=$(
  {
    cat "$definition/execution-environment.yml" "$definition/requirements.yml"
    for t in "$definition"/collections/*.tar.gz; do tar -xzOf "$t" MANIFEST.json; done
    find "$definition/extra-ca-certs" -type f -print0 | sort -z | xargs -0r cat
    echo "$base_id"
    ansible-builder --version
  } | sha256sum | cut -c1-16
)
image="localhost/$image_name:$inputs_hash"

cold=()
if [ "${EE_NO_CACHE:-0}" = 1 ]; then cold=(--no-cache); fi
if [ ${#cold[@]} -eq 0 ] && podman image exists "$image"; then
  echo "execution environment $image: cached" >&2
else
  start=$(date +%s)
  log="$work/build.log"
  if ! ansible-builder build --file "$definition/execution-environment.yml" --context "$work/context" \
      --tag "$image" --container-runtime podman --verbosity 2 "${cold[@]}" \
      --build-arg ANSIBLE_GALAXY_CLI_COLLECTION_OPTS=--offline >"$log" 2>&1; then
    echo "ansible-builder failed; the last lines of $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  echo "execution environment $image: built in $(( $(date +%s) - start ))s" >&2
  # This checkout's earlier builds are outdated now (each holds a few hundred MB): remove those it recorded, and no
  # other image. One still in use by a container stays (podman refuses), and stays recorded.
  kept=()
  if [ -f "$record" ]; then
    while IFS= read -r old; do
      if [ -z "$old" ] || [ "$old" = "$image" ]; then continue; fi
      if podman image exists "$old" && ! podman rmi "$old" >/dev/null 2>&1; then kept+=("$old"); fi
    done <"$record"
  fi
  printf '%s\n' "${kept[@]}" "$image" | grep -v '^$' >"$record.new" && mv "$record.new" "$record"
fi
if [ -n "${EE_TAG:-}" ]; then podman tag "$image" "$EE_TAG"; fi
echo "$image"

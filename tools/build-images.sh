#!/usr/bin/env bash
# Builds the Debian node images the molecule scenarios and the demo run on, with debootstrap, and imports them into
# podman as kubegpu-node-test:<suite>. An image that already exists is kept: delete it (`podman rmi`) to rebuild.
# Suites build in parallel; each takes a few minutes on a fresh machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work="$root/.tmp/images"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(bullseye bookworm trixie)
mkdir -p "$work"

build() {
  local suite=$1 image="kubegpu-node-test:$1" dir="$work/rootfs-$1" log="$work/$1.log" start
  if podman image exists "$image"; then echo "image $image: cached"; return 0; fi
  start=$(date +%s)
  rm -rf "$dir"
  if ! debootstrap --variant=minbase \
      --include=python3,python3-apt,systemd,systemd-sysv,sudo,gnupg,ca-certificates,iproute2,procps \
      "$suite" "$dir" "$mirror" >"$log" 2>&1; then
    echo "debootstrap $suite failed; last lines of $log:" >&2; tail -n 20 "$log" >&2; return 1
  fi
  # The apt sources a node of that suite would have (debootstrap writes none for minbase).
  printf 'deb %s %s main\n' "$mirror" "$suite" >"$dir/etc/apt/sources.list"
  # A stable machine-id per container comes from systemd at boot.
  : >"$dir/etc/machine-id"
  tar -C "$dir" -c . | podman import --change 'CMD ["/sbin/init"]' - "$image" >>"$log"
  rm -rf "$dir"
  echo "image $image: built in $(( $(date +%s) - start ))s"
}

pids=()
for s in "${suites[@]}"; do build "$s" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc

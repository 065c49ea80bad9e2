#!/usr/bin/env bash
# Builds the Debian node images the molecule scenarios and the demo run on, with debootstrap, and imports them into
# podman as kubegpu-node-test:<suite>. An image that already exists is kept while it was built from this recipe (its
# kubegpu.recipe label: a hash of the packages and steps below); one built from another recipe is built again. Delete
# one (`podman rmi`) to rebuild it anyway. Suites build in parallel; each takes a few minutes on a fresh machine.
#
# openssh-server is in the image, its units disabled: molecule reaches the containers with ansible's ssh connection,
# through `podman exec ... sshd -i` (tools/molecule-ssh-proxy.sh), and the demo starts sshd itself (demo/prepare.yml).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work="$root/.tmp/images"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(bullseye bookworm trixie)
mkdir -p "$work"

packages=python3,python3-apt,systemd,systemd-sysv,sudo,gnupg,ca-certificates,iproute2,procps,openssh-server
# Change the revision when a step below changes what an image holds (the package list counts by itself).
recipe=$(printf 'packages=%s revision=3' "$packages" | sha256sum | cut -c1-16)

build() {
  local suite=$1 image="kubegpu-node-test:$1" dir="$work/rootfs-$1" log="$work/$1.log" start built
  if podman image exists "$image"; then
    built=$(podman image inspect --format '{{ index .Labels "kubegpu.recipe" }}' "$image" 2>/dev/null || true)
    if [ "$built" = "$recipe" ]; then echo "image $image: cached"; return 0; fi
    echo "image $image: built from another recipe (${built:-none}), building it again"
  fi
  start=$(date +%s)
  rm -rf "$dir"
  if ! debootstrap --variant=minbase --include="$packages" "$suite" "$dir" "$mirror" >"$log" 2>&1; then
    echo "debootstrap $suite failed; last lines of $log:" >&2; tail -n 20 "$log" >&2; return 1
  fi
  # The apt sources a node of that suite would have (debootstrap writes none for minbase).
  printf 'deb %s %s main\n' "$mirror" "$suite" >"$dir/etc/apt/sources.list"
  # A stable machine-id per container comes from systemd at boot.
  : >"$dir/etc/machine-id"
  # sshd listens on no port in a test container (molecule starts `sshd -i` per connection); the demo enables it.
  # Every link its [Install] made goes, the Alias sshd.service too: with that one left, `systemctl is-enabled ssh`
  # says enabled and the demo's enable does nothing (sshd did not start after a reboot). On Debian 13, systemd's
  # ssh generator would also bind sshd to an AF_UNIX socket of the container's own: masked.
  find "$dir/etc/systemd/system" \( -lname '*/ssh.service' -o -lname '*/ssh.socket' \) -delete
  mkdir -p "$dir/etc/systemd/system-generators"
  ln -sf /dev/null "$dir/etc/systemd/system-generators/systemd-ssh-generator"
  tar -C "$dir" -c . | podman import --change 'CMD ["/sbin/init"]' --change "LABEL kubegpu.recipe=$recipe" - "$image" >>"$log"
  rm -rf "$dir"
  echo "image $image: built in $(( $(date +%s) - start ))s"
}

pids=()
for s in "${suites[@]}"; do build "$s" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc

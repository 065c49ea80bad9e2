#!/usr/bin/env bash
# ssh's ProxyCommand for the molecule scenarios (.config/molecule/config.yml): `tools/molecule-ssh-proxy.sh NAME`
# speaks SSH with the test container NAME over `podman exec -i NAME sshd -i` (sshd in inetd mode, on stdin and
# stdout), so ansible reaches the containers with its ssh connection (pipelining, one ControlPersist master per host)
# instead of molecule's podman connection, which starts several podman processes for every task (bench/RESULTS.md,
# "2026-11-29": about 1.0 CPU-second per module task against 0.24 over SSH). No network: the container's sshd
# (tools/build-images.sh puts Debian's openssh-server in the image, its units disabled) serves this one connection
# and listens nowhere; PAM is off, so no login session starts; root logs in with the key that this script allows for
# the connection (.tmp/molecule/ssh/id_ed25519, made once by `--make-key`), written (whole, by a rename: connections
# may start at once) to the container's /run, which a reboot empties (the next connection writes it again).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/.tmp/molecule/ssh" key="$root/.tmp/molecule/ssh/id_ed25519"

if [ "${1:-}" = --make-key ]; then
  # tools/run-molecule.sh makes the key pair before any scenario starts (ssh reads the private key before it runs
  # this command, so the first connection cannot make it). Scenarios started at once share it.
  mkdir -p "$dir"
  (
    flock 9
    if [ ! -f "$key.pub" ]; then
      rm -f "$key.new" "$key.new.pub"
      ssh-keygen -q -t ed25519 -N '' -C kubegpu-molecule -f "$key.new"
      mv "$key.new" "$key" && mv "$key.new.pub" "$key.pub"
    fi
  ) 9>"$dir/lock"
  exit 0
fi

name=${1:?usage: molecule-ssh-proxy.sh CONTAINER, or molecule-ssh-proxy.sh --make-key}
if [ ! -f "$key.pub" ]; then
  echo "molecule-ssh-proxy.sh: no key pair at $key: run the scenarios with tools/run-molecule.sh (make molecule)," \
    "or make it once with tools/molecule-ssh-proxy.sh --make-key" >&2
  exit 1
fi
# shellcheck disable=SC2016 # $1 is the container shell's, given the public key as its argument.
exec podman exec -i "$name" /bin/sh -c '
  umask 077 && mkdir -p /run/kubegpu-molecule && printf "%s\n" "$1" >"/run/kubegpu-molecule/keys.$$" &&
  mv -f "/run/kubegpu-molecule/keys.$$" /run/kubegpu-molecule/authorized_keys &&
  mkdir -p -m 0755 /run/sshd &&
  exec /usr/sbin/sshd -i -o UsePAM=no -o LogLevel=ERROR -o AuthorizedKeysFile=/run/kubegpu-molecule/authorized_keys
' sh "$(cat "$key.pub")"

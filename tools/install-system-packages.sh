#!/usr/bin/env bash
# Debian packages the tests and the demo need. Installs only what is missing, so a second run costs nothing.
set -euo pipefail
# apt-utils (apt-ftparchive), gnupg and gpgv build and check the signed stand-in repositories of tests/aptrepo.
packages=(podman runc debootstrap uidmap slirp4netns fuse-overlayfs debian-archive-keyring shellcheck apt-utils gnupg gpgv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "Installing Debian packages: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

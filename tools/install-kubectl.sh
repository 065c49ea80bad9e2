#!/usr/bin/env bash
# Debian's kubectl (a static client) from sid, downloaded through apt so the archive's signatures are checked,
# into a private apt state: the machine's own sources and package database stay untouched.
set -euo pipefail
dest=${1:?usage: install-kubectl.sh DEST}
bin="$dest/bin/kubectl"
if [ -x "$bin" ] && "$bin" version --client >/dev/null 2>&1; then exit 0; fi
state="$dest/apt-sid"
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$dest/bin" "$dest/kubectl-root"
touch "$state/status"
cat > "$state/sources.list" <<LIST
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main
LIST
opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o "Dir::Etc::SourceParts=-" -o "Dir::State::Lists=$state/lists"
      -o "Dir::Cache=$state/cache" -o "Dir::State::status=$state/status" -o "APT::Get::List-Cleanup=0" -o "Debug::NoLocking=1")
apt-get "${opts[@]}" update -qq
(cd "$state" && apt-get "${opts[@]}" download kubectl >/dev/null)
dpkg-deb -x "$state"/kubectl_*.deb "$dest/kubectl-root"
ln -sfn "$dest/kubectl-root/usr/bin/kubectl" "$bin"
"$bin" version --client

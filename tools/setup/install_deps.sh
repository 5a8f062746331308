#!/usr/bin/env bash
# Installs what building and testing Tarantella needs and is missing:
# Debian packages with apt-get (as root, or through sudo). Safe to re-run;
# it does nothing when everything is present.
set -euo pipefail

DEB_PACKAGES=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libcmocka-dev
              clang libclang-rt-14-dev numactl iproute2)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "tarantella: installing Debian packages: ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

#!/usr/bin/env bash
# Installs the Debian packages pipesim needs (only those missing), then configures ./build and builds
# the program there (build/tools/pipesim), nothing else: `meson test -C build` builds the tests and what
# they run before running them, and `ninja -C build` everything (the MPI and CUDA plugins that `mpirun`
# and `--backend cuda` load, the benches). Safe to run again: it only does what is not done yet.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
while read -r package; do
  [[ -z "$package" || "$package" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done < tools/debian-packages.txt

if ((${#missing[@]})); then
  echo "pipesim setup: installing ${missing[*]}" >&2
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[[ -f build/build.ninja ]] || meson setup build >/dev/null
ninja -C build tools/pipesim >/dev/null
echo "pipesim setup: built build/tools/pipesim" >&2

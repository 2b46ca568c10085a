#!/usr/bin/env bash
# Installs the pinned Debian 12 packages mapp needs, only those missing.
# Usage: scripts/setup.sh [--gpu-machine]   (no-op when everything is present)
set -euo pipefail
source "$(dirname "$0")/progress.sh"

PKGS=(
  "cmake=3.25.1-1"
  "ninja-build=1.11.1-2~deb12u1"
  "ccache=4.8+really4.7.5-1"
  "g++=4:12.2.0-3"
  "libmlir-19-dev=1:19.1.7-3~deb12u1"
  "mlir-19-tools=1:19.1.7-3~deb12u1"
  "llvm-19-dev=1:19.1.7-3~deb12u1"
  "llvm-19-tools=1:19.1.7-3~deb12u1"
  "libgtest-dev=1.12.1-0.2"
  "libflatbuffers-dev=2.0.8+dfsg1-2"
  "flatbuffers-compiler=2.0.8+dfsg1-2"
  "libopenmpi-dev=4.1.4-3+b1"
  "openmpi-bin=4.1.4-3+b1"
  "libopenblas-dev=0.3.21+ds-4"
  "libsqlite3-dev=3.40.1-2+deb12u2"
  "zlib1g-dev=1:1.2.13.dfsg-1"
  "nlohmann-json3-dev=3.11.2-2"
  "libcpp-httplib-dev=0.11.4+ds-1+deb12u1"
  "python3-torch=1.13.1+dfsg-4"
  "python3-numpy=1:1.24.2-1+deb12u1"
  "python3-pytest=7.2.1-2"
  "python3-yaml=6.0-3+b2"
  "chromium=156.0.8078.108-1~deb12u1"
)
# MegaScope's web UI is built with npm + Vite (tools/mapp-scope/web, Vite
# 5.4 runs on Debian's Node 18). A node already on the PATH (e.g. a newer
# one from elsewhere) is kept: the Debian packages are added only when the
# commands are missing.
command -v node >/dev/null || PKGS+=("nodejs=18.20.4+dfsg-1~deb12u3")
command -v npm >/dev/null || PKGS+=("npm=9.2.0~ds1-1")

# MegaScope's browser test drives Debian's chromium with playwright-core
# (pinned in test/Tools/mapp-scope/browser/package-lock.json).
install_browser_test() {
  local dir
  dir="$(dirname "$0")/../test/Tools/mapp-scope/browser"
  if [ -d "$dir" ] && [ ! -d "$dir/node_modules/playwright-core" ] &&
     command -v npm >/dev/null; then
    (cd "$dir" && npm ci --no-audit --no-fund --silent) ||
      echo "setup: npm ci in $dir failed; the browser test will skip" >&2
  fi
}
trap install_browser_test EXIT

missing=()
for spec in "${PKGS[@]}"; do
  name=${spec%%=*}
  if ! dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$spec")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${#missing[@]} missing package(s): ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
# -qq keeps apt's output to errors, so the heartbeat shows it is alive.
with_heartbeat "apt-get update" $SUDO apt-get update -qq
if ! with_heartbeat "apt-get install" \
     $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
  # Security updates (chromium above all) retire old versions from the
  # mirrors: fall back to the current version of each, loudly.
  echo "setup: a pinned version is no longer available; installing current versions" >&2
  with_heartbeat "apt-get install" \
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]%%=*}"
fi

#!/usr/bin/env bash
# Builds MegaScope's web UI into OUT (CMake's mapp-scope-web target runs it).
#   tools/mapp-scope/web/build-ui.sh OUT
# node_modules is a cache beside the sources (git-ignored): `npm ci` runs
# only when it is missing or package-lock.json changed since it was made.
set -euo pipefail
out=${1:?usage: build-ui.sh OUTDIR}
cd "$(dirname "$0")"
for tool in node npm; do
  command -v "$tool" >/dev/null ||
    { echo "build-ui.sh: $tool not found (scripts/setup.sh installs it)" >&2; exit 1; }
done
lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f node_modules/.mapp-lock-sha256 ] ||
   [ "$(cat node_modules/.mapp-lock-sha256)" != "$lock_sum" ]; then
  echo "mapp-scope web: npm ci (node $(node --version), lock ${lock_sum:0:12})"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_sum" > node_modules/.mapp-lock-sha256
else
  echo "mapp-scope web: node_modules up to date with package-lock.json"
fi
echo "mapp-scope web: vite build -> $out"
MAPP_SCOPE_WEB_OUT="$out" npm run --silent build
test -f "$out/index.html"

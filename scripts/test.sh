#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test
# (lit + FileCheck, GoogleTest, pytest, end-to-end runs) through CTest.
# Ends with CTest's summary line; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure --timeout 1500 -j"$(nproc)"

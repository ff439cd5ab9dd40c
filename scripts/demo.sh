#!/usr/bin/env bash
# Sets up the project on a fresh machine (scripts/setup.sh), then runs the demo: a local Prefect
# server and the emulator on loopback, the pipeline over the bundled samples of B1_glaive,
# B2_opencodeinstruct and B3_magicoder (and B1_glaive's whole conversations) with the bundled mini
# tokenizer. Arguments go to
# `specregen demo` (e.g. --keep-server, --out DIR).
set -euo pipefail
source "$(dirname "$0")/setup.sh"
cd "$root"
exec specregen demo "$@"

#!/usr/bin/env bash
# Install toxiproxy-server pinned to v2.12.0 (idempotent): a wrapper for the script that
# `pdchaos setup` runs (harness/scripts/install-toxiproxy.sh, shipped as package data).
#
#   bash .ci/install-toxiproxy.sh
#   TOXIPROXY_BIN_DIR=/some/dir bash .ci/install-toxiproxy.sh
set -euo pipefail
exec bash "$(dirname "$0")/../harness/scripts/install-toxiproxy.sh" "$@"

#!/usr/bin/env bash
# Install toxiproxy-server pinned to v2.12.0 (idempotent).
#
#   bash harness/scripts/install-toxiproxy.sh   # into /usr/local/bin if writable, else ~/.local/bin
#   TOXIPROXY_BIN_DIR=/some/dir bash harness/scripts/install-toxiproxy.sh
#
# With Go on the machine it builds the pinned release from the Go module proxy. The version is
# stamped with -ldflags like the upstream release build does (.goreleaser.yml), so that
# `toxiproxy-server -version` prints 2.12.0 instead of "git" (a plain `go install` leaves "git").
# Without Go it prints the other ways and exits 1.
# `pdchaos setup` (harness/setup.py) runs this script; .ci/install-toxiproxy.sh is a wrapper for it.
set -euo pipefail

PIN="2.12.0"
PKG="github.com/Shopify/toxiproxy/v2"

say() { printf 'install-toxiproxy: %s\n' "$*"; }

# What version does a binary report? "2.12.0", or the module version from its build info when the
# binary was built without the version stamp ("git"), or "" when it does not run.
binary_version() {
  local bin="$1" out ver
  out="$("$bin" -version 2>/dev/null || true)"
  ver="$(printf '%s\n' "$out" | sed -n 's/.*version[[:space:]]\{1,\}v\{0,1\}\([^[:space:]]*\).*/\1/p' | head -n1)"
  if [ "$ver" = "git" ] && command -v go >/dev/null 2>&1; then
    ver="$(go version -m "$bin" 2>/dev/null | awk -v pkg="$PKG" '$1=="mod" && $2==pkg {sub(/^v/,"",$3); print $3; exit}')"
  fi
  printf '%s' "$ver"
}

if existing="$(command -v toxiproxy-server 2>/dev/null)"; then
  have="$(binary_version "$existing")"
  if [ "$have" = "$PIN" ]; then
    say "toxiproxy-server v$PIN already on PATH at $existing: nothing to do"
    exit 0
  fi
  say "toxiproxy-server on PATH at $existing reports '${have:-unknown}', want v$PIN: installing v$PIN"
fi

if ! command -v go >/dev/null 2>&1; then
  for d in /usr/local/go/bin "$HOME/go/bin"; do
    if [ -x "$d/go" ]; then PATH="$d:$PATH"; break; fi
  done
fi

if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<MSG
install-toxiproxy: Go is not installed, so toxiproxy-server v$PIN cannot be built here.
Other ways to get it (then put it on PATH as toxiproxy-server, or set PDCHAOS_TOXIPROXY_SERVER):
  - the release binary: https://github.com/Shopify/toxiproxy/releases/tag/v$PIN
      asset toxiproxy-server-linux-amd64 (or -arm64); chmod +x; mv to a bin dir as toxiproxy-server
  - the container image: ghcr.io/shopify/toxiproxy:$PIN
      docker run --rm --network host ghcr.io/shopify/toxiproxy:$PIN -host 127.0.0.1 -port PORT
      (pdchaos starts the server itself; with a container, run scenarios that need it on the same host network)
  - the Debian package from the same release page (toxiproxy_${PIN}_linux_amd64.deb)
Without it, scenarios that need Toxiproxy are reported as skipped.
MSG
  exit 1
fi

if [ -n "${TOXIPROXY_BIN_DIR:-}" ]; then
  bindir="$TOXIPROXY_BIN_DIR"
elif [ -w /usr/local/bin ]; then
  bindir=/usr/local/bin
else
  bindir="$HOME/.local/bin"
fi
mkdir -p "$bindir"

build="$(mktemp -d "${TMPDIR:-/tmp}/pdc-toxiproxy.XXXXXX")"
trap 'rm -rf "$build"' EXIT
say "building $PKG/cmd/server@v$PIN with $(go version | awk '{print $3}')"
GOBIN="$build" CGO_ENABLED=0 \
  go install -ldflags="-s -w -X $PKG.Version=$PIN" "$PKG/cmd/server@v$PIN"
install -m 0755 "$build/server" "$bindir/toxiproxy-server"

got="$(binary_version "$bindir/toxiproxy-server")"
if [ "$got" != "$PIN" ]; then
  say "built binary reports '${got:-nothing}', expected $PIN" >&2
  exit 1
fi
say "installed toxiproxy-server v$PIN at $bindir/toxiproxy-server"
case ":$PATH:" in
  *":$bindir:"*) ;;
  *) say "note: $bindir is not on PATH; add it, or set PDCHAOS_TOXIPROXY_SERVER=$bindir/toxiproxy-server" ;;
esac

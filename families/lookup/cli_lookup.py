"""``pdchaos lookup``: one lookup, one JSON line; a fail-open result is not an error (exit 0)."""

from __future__ import annotations

import argparse
import json
import time

from connector_patch.lookup import LookupClient

from nodekit.nodeio import check_endpoint
from harness.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", required=True)
    p.add_argument("--token-len", type=int, required=True)
    p.add_argument("--hashes-file", required=True, help="one block-hash hex per line")
    p.add_argument("--timeout-ms", type=int, default=5000)
    p.add_argument("--groups", default="0", help="comma-separated KV cache group ids (default 0)")
    p.add_argument("--hbm-hit-tokens", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from .server_node import read_preload

    check_endpoint(args.endpoint)
    if args.token_len < 0:
        raise UsageError("--token-len: must be >= 0")
    if args.hbm_hit_tokens < 0:
        raise UsageError("--hbm-hit-tokens: must be >= 0")
    try:
        groups = tuple(int(g) for g in args.groups.split(","))
    except ValueError:
        raise UsageError(f"--groups: {args.groups!r} is not a comma-separated list of integers") from None
    hashes = [bytes.fromhex(h) for h in read_preload(args.hashes_file, "--hashes-file")]
    try:
        client = LookupClient(args.endpoint, args.timeout_ms)
    except ValueError as exc:
        raise UsageError(f"--timeout-ms: {exc}") from None
    try:
        start = time.monotonic()
        hit = client.lookup(args.token_len, hashes, groups, args.hbm_hit_tokens)
        elapsed = (time.monotonic() - start) * 1000.0
        print(json.dumps({"hit_tokens": hit, "outcome": client.last_outcome, "code": client.last_code,
                          "elapsed_ms": round(elapsed, 3)}))
    finally:
        client.close()
    return 0

"""``pdchaos fuzz lookup``: random and mutated frame lists against a live lookup server.

What it sends: the cases of :mod:`families.lookup.fuzzgen` (valid lookups, the ``b"reset"`` admin frame,
wrong frame counts, truncated/extended int frames, msgpack in int frames, out-of-range values,
bad group ids, non-hex hashes, corrupted msgpack, random frame lists, oversized lists and frames).
The stream depends only on ``--seed`` (printed when it was not given), so a run can be repeated.

How: one DEALER socket with an empty delimiter frame, many requests in flight (``--window``).
Why DEALER and not REQ with a per-request deadline: a REQ socket allows one request at a time and
has to be rebuilt after every timeout, so 100,000 requests would pay one full round trip each and
a dead server would cost one deadline per request. With DEALER the server's REP socket sees an
ordinary request (REP strips and echoes everything up to the empty delimiter), so we prepend an
8-byte request id before the delimiter: the server echoes it back untouched, which matches every
reply to its request exactly and makes a duplicate or unknown reply visible.

Per request: a deadline (``--timeout-ms``) from the moment it was sent. A reply within the deadline
is *answered*; none is *unanswered*; a reply after the deadline is also counted as *late*; a second
reply to the same id is a *duplicate*. Each reply must be a well-formed protocol-v1 envelope
(else *invalid*), and must agree with what the case expects (an ok for a valid lookup, an error
with the expected code for a one-mutation case; else a *mismatch*).

A server that answers nothing for ``--give-up-ms`` (default 3 x the timeout) while requests are
outstanding is presumed dead: the fuzzer stops sending, waits for the outstanding deadlines and
reports ``stopped_early`` and ``not_sent`` (each later request would only cost another deadline).

Alive check at the start and at the end, with the real hardened ``LookupClient`` (one deadline of
``--timeout-ms`` each), all of which must return an ``ok`` reply with the right hit:
  - miss: token_len 64 and fresh random hashes, hbm_hit_tokens 0 -> hit 0;
  - hbm:  token_len 64, 64 fresh random hashes, hbm_hit_tokens 64 -> hit 64 whatever the server's
    block size (every block lies within the HBM prefix);
  - preload (with ``--check-hashes-file FILE --check-token-len N``): the file's hashes, which the
    server preloaded (``pdchaos node lookup-server --preload FILE``) -> hit N. Pick N at most the
    file's hash count times the server's block size. A ``reset`` clears the server's store, so
    with a check file no reset frames are sent (``--no-reset`` turns them off in any case).

Exit 0 when every request was sent and answered exactly once, every reply was a well-formed
envelope agreeing with its case, and the server is alive at the end; 1 otherwise; 2 bad input.
Logs and output carry counts and codes only, never frames or hashes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import zmq

from connector_patch.lookup import LookupClient
from connector_patch.lookup.protocol import MAX_TOKEN_LEN, ProtocolError, decode_reply

from nodekit.nodeio import check_endpoint
from harness.errors import UsageError
from .fuzzgen import FrameGen

_ID_LEN = 8
_MAX_WINDOW = 1000  # the DEALER's default send high-water mark
_MAX_REQUESTS = 100_000_000  # one byte of state per request


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", required=True, help="the live server: ipc:///path or tcp://127.0.0.1:PORT")
    p.add_argument("--requests", type=int, required=True, help="how many requests to send")
    p.add_argument("--seed", type=int, default=None, help="makes the run repeatable (default: random, printed)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--timeout-ms", type=int, default=2000, help="per-request deadline (default 2000)")
    p.add_argument("--window", type=int, default=32, help=f"requests in flight (1..{_MAX_WINDOW}, default 32)")
    p.add_argument("--groups", type=int, default=1,
                   help="the server's KV cache group count (valid ids are below it; default 1)")
    p.add_argument("--give-up-ms", type=int, default=None,
                   help="stop sending after this long without any reply (default 3 x --timeout-ms)")
    p.add_argument("--no-reset", action="store_true", help="never send the b'reset' admin frame")
    p.add_argument("--check-hashes-file", help="hashes the server preloaded, one hex per line (alive check)")
    p.add_argument("--check-token-len", type=int, help="token_len for the preload check; expected hit")


@dataclass
class Stats:
    sent: int = 0
    answered: int = 0
    unanswered: int = 0
    late: int = 0
    duplicates: int = 0
    unmatched: int = 0
    ok: int = 0
    errors_by_code: Counter = field(default_factory=Counter)
    invalid_by_code: Counter = field(default_factory=Counter)
    mismatches_by_kind: Counter = field(default_factory=Counter)
    sent_by_kind: Counter = field(default_factory=Counter)
    stopped_early: bool = False


# ------------------------------------------------------------------ input checks
def _positive(value: int | None, flag: str, upper: int | None = None) -> None:
    if value is None:
        return
    if value <= 0 or (upper is not None and value > upper):
        bound = f" and at most {upper}" if upper is not None else ""
        raise UsageError(f"{flag}: must be a positive integer{bound}, got {value}")


def _check_args(args: argparse.Namespace) -> list[bytes] | None:
    check_endpoint(args.endpoint)
    _positive(args.requests, "--requests", _MAX_REQUESTS)
    _positive(args.timeout_ms, "--timeout-ms")
    _positive(args.window, "--window", _MAX_WINDOW)
    _positive(args.groups, "--groups")
    _positive(args.give_up_ms, "--give-up-ms")
    if (args.check_hashes_file is None) != (args.check_token_len is None):
        raise UsageError("--check-hashes-file and --check-token-len: give both or neither")
    if args.check_hashes_file is None:
        return None
    _positive(args.check_token_len, "--check-token-len", MAX_TOKEN_LEN)
    from .server_node import read_preload

    hashes = [bytes.fromhex(h) for h in read_preload(args.check_hashes_file, "--check-hashes-file")]
    if not hashes:
        raise UsageError(f"--check-hashes-file: {args.check_hashes_file!r} holds no hashes")
    return hashes


# ------------------------------------------------------------------ alive check
def _alive_checks(endpoint: str, timeout_ms: int, rng: random.Random,
                  preload: list[bytes] | None, preload_token_len: int | None) -> dict[str, bool]:
    """Known-answer lookups through the real hardened client; each must be ``ok`` with the hit."""
    plan: list[tuple[str, int, list[bytes], int, int]] = [
        ("miss", 64, [rng.randbytes(32) for _ in range(4)], 0, 0),
        ("hbm", 64, [rng.randbytes(32) for _ in range(64)], 64, 64),
    ]
    if preload is not None and preload_token_len is not None:
        plan.append(("preload", preload_token_len, preload, 0, preload_token_len))
    results: dict[str, bool] = {}
    client = LookupClient(endpoint, timeout_ms)
    try:
        for name, token_len, hashes, hbm, expected in plan:
            hit = client.lookup(token_len, hashes, (0,), hbm)
            results[name] = client.last_outcome == "ok" and hit == expected
            if not results[name]:
                break  # a dead server would cost one deadline per further check
    finally:
        client.close()
    for name, *_ in plan:
        results.setdefault(name, False)
    return results


# ------------------------------------------------------------------ the run
class _Progress:
    """A rich progress bar on a terminal (stderr); nothing at all otherwise."""

    def __init__(self, total: int):
        self._bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("fuzz"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task("fuzz", total=total)
            self._bar.start()

    def update(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _classify(stats: Stats, case, frames: list[bytes]) -> None:
    token_len = case.token_len if case.expect == "ok" else None
    try:
        reply = decode_reply(frames, token_len)
    except ProtocolError as exc:
        stats.invalid_by_code[exc.code] += 1
        return
    if reply.ok:
        stats.ok += 1
        if case.expect == "error":
            stats.mismatches_by_kind[case.kind] += 1
    else:
        stats.errors_by_code[reply.code] += 1
        if case.expect == "ok" or (case.expect == "error" and case.code and reply.code != case.code):
            stats.mismatches_by_kind[case.kind] += 1


def fuzz(endpoint: str, requests: int, gen: FrameGen, timeout_s: float, window: int,
         give_up_s: float, progress: _Progress | None = None) -> Stats:
    stats = Stats()
    # state per request id (1..requests): 0 not answered yet, 1 answered, 2 expired, 3 answered late
    state = bytearray(requests + 1)
    pending: dict[int, tuple[float, object]] = {}  # id -> (deadline, case), in send (= deadline) order
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    poller = zmq.Poller()
    carry = None  # a generated case that could not be sent yet (keeps the stream seed-only)
    try:
        sock.connect(endpoint)
        last_reply = time.monotonic()
        next_progress = 0
        while True:
            # 1. fill the window
            blocked = False
            while stats.sent < requests and len(pending) < window and not stats.stopped_early:
                case = carry if carry is not None else gen.next()
                rid = stats.sent + 1
                try:
                    sock.send_multipart([rid.to_bytes(_ID_LEN, "big"), b"", *case.frames], flags=zmq.NOBLOCK)
                except zmq.Again:
                    carry, blocked = case, True
                    break
                carry = None
                now = time.monotonic()
                pending[rid] = (now + timeout_s, case)
                stats.sent += 1
                stats.sent_by_kind[case.kind] += 1
            if not pending and (stats.sent >= requests or stats.stopped_early):
                break
            # 2. wait for replies (or room to send), at most until the oldest deadline
            now = time.monotonic()
            wait_ms = 50
            if pending:
                first_deadline = next(iter(pending.values()))[0]
                wait_ms = max(0, min(50, int((first_deadline - now) * 1000) + 1))
            poller.register(sock, zmq.POLLIN | (zmq.POLLOUT if blocked else 0))
            poller.poll(wait_ms)
            # 3. take every reply there is
            while True:
                try:
                    msg = sock.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                last_reply = time.monotonic()
                if len(msg) < 2 or len(msg[0]) != _ID_LEN or msg[1] != b"":
                    stats.unmatched += 1
                    continue
                rid = int.from_bytes(msg[0], "big")
                if not 1 <= rid <= requests:
                    stats.unmatched += 1
                    continue
                st = state[rid]
                if st == 0:
                    entry = pending.pop(rid, None)
                    if entry is None:  # not sent by us in this run
                        stats.unmatched += 1
                        continue
                    state[rid] = 1
                    stats.answered += 1
                    _classify(stats, entry[1], msg[2:])
                elif st == 2:
                    state[rid] = 3
                    stats.late += 1
                else:
                    stats.duplicates += 1
            # 4. expire overdue requests
            now = time.monotonic()
            while pending:
                rid, (deadline, _case) = next(iter(pending.items()))
                if deadline > now:
                    break
                del pending[rid]
                state[rid] = 2
                stats.unanswered += 1
            # 5. a silent server: stop sending
            if (stats.unanswered and stats.sent < requests and not stats.stopped_early
                    and now - last_reply > give_up_s):
                stats.stopped_early = True
            if progress is not None and stats.sent >= next_progress:
                progress.update(stats.sent)
                next_progress = stats.sent + 512
        if progress is not None:
            progress.update(stats.sent)
    finally:
        sock.close(linger=0)
        ctx.term()
    return stats


def _summary(args: argparse.Namespace, seed: int, stats: Stats, alive_start: dict[str, bool],
             alive_end: dict[str, bool], elapsed_s: float, allow_reset: bool) -> dict:
    alive = all(alive_end.values())
    invalid = sum(stats.invalid_by_code.values())
    mismatches = sum(stats.mismatches_by_kind.values())
    reasons = []
    if stats.sent < args.requests:
        reasons.append(f"{args.requests - stats.sent} not sent (server presumed dead)")
    if stats.unanswered:
        reasons.append(f"{stats.unanswered} unanswered")
    if stats.duplicates:
        reasons.append(f"{stats.duplicates} duplicate replies")
    if stats.unmatched:
        reasons.append(f"{stats.unmatched} unmatched replies")
    if invalid:
        reasons.append(f"{invalid} replies not a v1 envelope")
    if mismatches:
        reasons.append(f"{mismatches} replies disagree with the request")
    if not alive:
        reasons.append("server not alive at the end")
    return {
        "target": "lookup",
        "seed": seed,
        "requests": args.requests,
        "sent": stats.sent,
        "answered": stats.answered,
        "unanswered": stats.unanswered,
        "late": stats.late,
        "duplicates": stats.duplicates,
        "unmatched": stats.unmatched,
        "ok": stats.ok,
        "errors": sum(stats.errors_by_code.values()),
        "errors_by_code": dict(sorted(stats.errors_by_code.items())),
        "invalid_replies": invalid,
        "invalid_by_code": dict(sorted(stats.invalid_by_code.items())),
        "mismatches": mismatches,
        "mismatches_by_kind": dict(sorted(stats.mismatches_by_kind.items())),
        "sent_by_kind": dict(sorted(stats.sent_by_kind.items())),
        "resets_sent": stats.sent_by_kind.get("reset", 0),
        "reset_enabled": allow_reset,
        "stopped_early": stats.stopped_early,
        "not_sent": args.requests - stats.sent,
        "alive_at_start": all(alive_start.values()),
        "alive": alive,
        "checks": alive_end,
        "timeout_ms": args.timeout_ms,
        "window": args.window,
        "elapsed_s": round(elapsed_s, 3),
        "requests_per_s": round(stats.sent / elapsed_s, 1) if elapsed_s > 0 else None,
        "passed": not reasons,
        "reasons": reasons,
    }


def _print_table(s: dict, endpoint: str) -> None:
    yn = {True: "yes", False: "NO"}
    rows = [
        ("sent", s["sent"]), ("answered", s["answered"]), ("unanswered", s["unanswered"]),
        ("late", s["late"]), ("duplicates", s["duplicates"]), ("unmatched", s["unmatched"]),
        ("ok replies", s["ok"]), ("error replies", s["errors"]), ("invalid replies", s["invalid_replies"]),
        ("mismatches", s["mismatches"]), ("resets sent", s["resets_sent"]),
        ("alive at start", yn[s["alive_at_start"]]), ("alive at end", yn[s["alive"]]),
        ("elapsed", f"{s['elapsed_s']:.1f} s ({s['requests_per_s']} req/s)"),
    ]
    if s["stopped_early"]:
        rows.insert(1, ("not sent", s["not_sent"]))
    print(f"fuzz lookup  endpoint={endpoint}  seed={s['seed']}  requests={s['requests']}  "
          f"timeout={s['timeout_ms']} ms  window={s['window']}")
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v:>12}")
    if s["errors_by_code"]:
        print("errors by code:")
        cw = max(len(c) for c in s["errors_by_code"])
        for code, n in s["errors_by_code"].items():
            print(f"  {code:<{cw}}  {n:>12}")
    for title, key in (("invalid replies by code:", "invalid_by_code"), ("mismatches by kind:", "mismatches_by_kind")):
        if s[key]:
            print(title)
            for k, n in s[key].items():
                print(f"  {k}  {n}")
    print("result: PASS" if s["passed"] else "result: FAIL (" + "; ".join(s["reasons"]) + ")")


def run(args: argparse.Namespace) -> int:
    preload = _check_args(args)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    allow_reset = not args.no_reset and preload is None
    timeout_s = args.timeout_ms / 1000.0
    give_up_s = (args.give_up_ms if args.give_up_ms is not None else 3 * args.timeout_ms) / 1000.0
    # The client's own failure warnings go nowhere: the result is in our report.
    logging.getLogger("connector_patch.lookup.client").addHandler(logging.NullHandler())
    check_rng = random.Random(seed ^ 0x5EED)
    gen = FrameGen(seed, groups=args.groups, allow_reset=allow_reset)

    alive_start = _alive_checks(args.endpoint, args.timeout_ms, check_rng, preload, args.check_token_len)
    progress = _Progress(args.requests)
    start = time.monotonic()
    try:
        stats = fuzz(args.endpoint, args.requests, gen, timeout_s, args.window, give_up_s, progress)
    finally:
        progress.close()
    elapsed = time.monotonic() - start
    alive_end = _alive_checks(args.endpoint, args.timeout_ms, check_rng, preload, args.check_token_len)
    summary = _summary(args, seed, stats, alive_start, alive_end, elapsed, allow_reset)
    if args.json:
        print(json.dumps(summary))
    else:
        _print_table(summary, args.endpoint)
    return 0 if summary["passed"] else 1

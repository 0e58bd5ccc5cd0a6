"""The upstream versions each hardened connector supports: one table, checked before a connector's
module imports anything of vLLM or vllm-ascend beyond their version numbers.

Each hardened connector subclasses upstream classes of one release and overrides a few of their
methods; on another release those methods may have other bodies or names, and a subclass that
imports cleanly can still do the wrong thing. So a connector loads only on a release listed here:

* ``TESTED``: the releases this repository's tests run it against (``tests/connector_patch/
  test_versions.py`` imports every connector in both node envs and checks the table against what
  each env holds): vLLM 0.32.0 in the P/D node env; vLLM 0.23.0 with vllm-ascend 0.23.0.post1 in the
  conformance env.
* ``NIGHTLY_ONLY``: releases where the connector imports and is built in the tests, but whose
  behaviour only the Ascend nightly can check (real NPUs): it loads and says so in one log line.

Anything else is refused when the server builds the connector: one line naming the connector, the
release found and the ones supported (:class:`UnsupportedUpstream`), nothing of it loaded.
Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys

logger = logging.getLogger("vllm.pdchaos.versions")

# connector -> {distribution: releases}; every distribution listed must match
TESTED: dict[str, dict[str, tuple[str, ...]]] = {
    "HardenedMooncakeConnector": {"vllm": ("0.32.0",)},
    "HardenedMooncakeStoreConnector": {"vllm": ("0.32.0",)},
    "HardenedAscendStoreConnector": {"vllm": ("0.23.0",), "vllm_ascend": ("0.23.0.post1",)},
    "HardenedMooncakeLayerwiseConnector": {"vllm": ("0.23.0",), "vllm_ascend": ("0.23.0.post1",)},
}
NIGHTLY_ONLY: dict[str, dict[str, tuple[str, ...]]] = {
    # none now. HardenedMooncakeConnector was listed on vLLM 0.23.0 + vllm-ascend 0.23.0.post1 (the
    # ascend launch profile), where it imports but no load can complete: 0.23's model runner calls
    # get_finished, never get_transfer_results; its PullReqMeta has no `failed`; its worker has no
    # kv_block_len_per_layer (issue 30, item 3; tests/connector_patch/test_versions.py checks those
    # facts in the conformance env). It is refused there, like any unsupported release.
}


class UnsupportedUpstream(RuntimeError):
    """A hardened connector asked for on an upstream release it does not support."""


def release(dist: str) -> str | None:
    """The installed release of ``dist`` without a local build tag (0.32.0+cpu -> 0.32.0); None
    when it is not installed."""
    try:
        return importlib.metadata.version(dist).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def _fits(table: dict[str, tuple[str, ...]], found: dict[str, str | None]) -> bool:
    return all(found.get(d) in rels for d, rels in table.items())


def _dists(connector: str) -> set[str]:
    if connector not in TESTED:
        raise KeyError(f"{connector}: not a hardened connector")
    return set(TESTED[connector]) | set(NIGHTLY_ONLY.get(connector, {}))


def status(connector: str, found: dict[str, str | None] | None = None) -> str:
    """"tested", "nightly-only" or "unsupported" for ``connector`` on the releases ``found``
    ({distribution: release or None}; default: what is installed)."""
    found = {d: release(d) for d in _dists(connector)} if found is None else found
    if _fits(TESTED[connector], found):
        return "tested"
    if connector in NIGHTLY_ONLY and _fits(NIGHTLY_ONLY[connector], found):
        return "nightly-only"
    return "unsupported"


def supported_text(connector: str) -> str:
    rows = [TESTED[connector]] + ([NIGHTLY_ONLY[connector]] if connector in NIGHTLY_ONLY else [])
    return "; ".join(" + ".join(f"{d} {'/'.join(r)}" for d, r in row.items()) for row in rows)


def require(connector: str, found: dict[str, str | None] | None = None) -> str:
    """Raise :class:`UnsupportedUpstream` (one line) unless ``connector`` supports the installed
    releases; log one line when it loads on a release only the nightly checks. Returns the status."""
    dists = _dists(connector)
    found = {d: release(d) for d in dists} if found is None else found
    st = status(connector, found)
    have = ", ".join(f"{d} {found.get(d) or 'absent'}" for d in sorted(dists))
    if st == "unsupported":
        raise UnsupportedUpstream(f"pdchaos: {connector} does not support {have} (supported: "
                                  f"{supported_text(connector)}); not loaded")
    if st == "nightly-only":
        logger.warning("pdchaos: %s on %s: loads here, checked only by the Ascend nightly", connector, have)
    return st


# ------------------------------------------------------------------ the command line (CI installs)
def pairs() -> list[tuple[str, str]]:
    """(vLLM release, vllm-ascend release) pairs some hardened vllm-ascend connector is TESTED on."""
    out = set()
    for row in TESTED.values():
        if "vllm_ascend" in row:
            out |= {(v, a) for v in row["vllm"] for a in row["vllm_ascend"]}
    return sorted(out)


def pairs_text() -> str:
    return ", ".join(f"vllm-ascend {a} with vLLM {v}" for v, a in pairs())


def _installed(allow: bool) -> int:
    bad = []
    for name in TESTED:
        st = status(name)
        print(f"{name}: {st} ({supported_text(name)})")
        if st == "unsupported" and "vllm_ascend" in TESTED[name]:
            bad.append(name)
    found = ", ".join(f"{d} {release(d) or 'absent'}" for d in ("vllm", "vllm_ascend"))
    if bad and not allow:
        print(f"error: installed {found}: {', '.join(bad)} do not support it ({pairs_text()})", file=sys.stderr)
        return 2
    if bad:
        print(f"warning: installed {found}: unsupported by {', '.join(bad)}; running anyway: their verdicts "
              "say less", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python3 -m connector_patch.versions pair --vllm-ascend A [--vllm V]``: exit 0 when the pair
    (or, without --vllm, the vllm-ascend release with some vLLM) is supported, else 2 and one line;
    ``pairs``: the supported pairs; ``installed [--allow-unsupported]``: every connector's status on
    what is installed, exit 2 when a vllm-ascend connector does not support it."""
    import argparse

    p = argparse.ArgumentParser(prog="python3 -m connector_patch.versions")
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("pair")
    pr.add_argument("--vllm-ascend", required=True)
    pr.add_argument("--vllm", default="")
    sub.add_parser("pairs")
    ins = sub.add_parser("installed")
    ins.add_argument("--allow-unsupported", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "pairs":
        print(pairs_text())
        return 0
    if args.cmd == "installed":
        return _installed(args.allow_unsupported)
    ok = [(v, a) for v, a in pairs() if a == args.vllm_ascend and (not args.vllm or v == args.vllm)]
    if ok:
        return 0
    what = f"vLLM {args.vllm} with vllm-ascend {args.vllm_ascend} is not a supported pair" if args.vllm else \
        f"vllm-ascend {args.vllm_ascend} is not supported by the hardened connectors"
    print(f"error: {what} ({pairs_text()}; --allow-unsupported to run anyway)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

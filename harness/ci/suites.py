"""Which scenario suites a workflow runs: ``python3 -m harness.ci.suites --filter "$FILTER" --profile P``.

A filter is a comma- or space-separated list of suite names (``lookup``, ``pd``...), each optionally
with ``:TEXT`` to keep only the scenarios whose name contains TEXT (``pdchaos run -k``); empty or
``all`` is the profile's default suites. Writes the step outputs ``matrix`` (JSON, for
``strategy.matrix``: ``{"include": [{"suite", "id", "path", "k", "args", "setup", "launch_profile", "runner",
"npus", "timeout", "install", "soc"}...]}`` (``install``: the install profile, ascend for jobs with NPUs, cpu otherwise; ``soc``: the runner chip's SOC_VERSION); ``launch_profile``: the ``pdchaos run --profile`` of the suite on that
profile's runners, empty for the default),
``paths`` (the suite folders, space-separated), ``count``, and for one job that runs every selected
suite in one ``pdchaos run`` (the pull-request comparison): ``run_args`` (paths, the targets when
every suite limits them, ``-k`` when all share one) and ``setup_args`` (``--only STEP`` per
``pdchaos setup`` step the suites need; empty: no setup needed). Exit 2 on an unknown suite or a suite
folder missing from the checkout.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .gha import set_output


class SelectError(ValueError):
    pass



# name -> where, which targets, on which runner, how long, in which profile's default set.
# cpu: the pull-request comparison (CPU runners); ascend: the nightly (NPU runners).
FAMILIES_DIR = "families"  # each family's CI suite rows: families/<name>/ci_suites.json
CHECKOUT = Path(__file__).resolve().parents[2]
KEYS = {"name", "order", "why", "path", "args", "runner", "timeout", "default", "setup", "npus", "launch_profile",
        "profiles"}


def load_suites(root: Path = CHECKOUT) -> dict[str, dict]:
    """Every family's suite rows (``families/*/ci_suites.json``), by name, in their ``order``: a
    family brings its own suites, the core names none. A malformed file is one SelectError naming
    it (a suite named twice, an unknown key, a missing field)."""
    rows: list[tuple[int, str, dict]] = []
    for f in sorted((root / FAMILIES_DIR).glob("*/ci_suites.json")):
        where = f.relative_to(root)
        try:
            data = json.loads(f.read_text())
            suites = data["suites"]
            for row in suites:
                extra = set(row) - KEYS
                if extra:
                    raise SelectError(f"{where}: suite {row.get('name')!r}: unknown key {sorted(extra)[0]!r}")
                rows.append((int(row["order"]), row["name"], {k: (tuple(v) if k in ("default", "profiles") else v)
                                                              for k, v in row.items() if k not in ("name", "order")}))
                for k in ("path", "args", "runner", "timeout", "default", "setup"):
                    if k not in row:
                        raise SelectError(f"{where}: suite {row['name']!r}: missing {k!r}")
        except SelectError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SelectError(f"{where}: not a suite file: {type(exc).__name__}: {exc}") from None
    out: dict[str, dict] = {}
    for _, name, row in sorted(rows, key=lambda r: r[0]):
        if name in out:
            raise SelectError(f"suite {name!r} is declared twice (families/*/ci_suites.json)")
        out[name] = row
    return out


PROFILES = ("cpu", "ascend")
# SOC_VERSION by runner label, as vllm-ascend's builds name the chips (A2 runners' label: a2b3)
SOC_BY_LABEL = (("-a3-", "ascend910_9391"), ("-310p-", "ascend310p1"), ("-a2b3-", "ascend910b1"))


def soc_of(runner: str) -> str:
    """The SOC_VERSION of a runner's chip; A2's (ascend910b1, also what vllm-ascend's CPU jobs set)
    for any other label."""
    return next((soc for part, soc in SOC_BY_LABEL if part in runner), "ascend910b1")
try:
    SUITES: dict[str, dict] = load_suites()
    _LOAD_ERROR = ""
except SelectError as _exc:  # said by main(): one line, exit 2
    SUITES, _LOAD_ERROR = {}, str(_exc)
_TOKEN = re.compile(r"^([a-z0-9][a-z0-9-]*)(?::([A-Za-z0-9_.-]+))?$")


def select(filter_text: str, profile: str, root: Path = Path(".")) -> list[dict]:
    if profile not in PROFILES:
        raise SelectError(f"--profile {profile!r}: expected one of {', '.join(PROFILES)}")
    tokens = [t for t in re.split(r"[,\s]+", filter_text or "") if t]
    if not tokens or tokens == ["all"]:
        tokens = [n for n, s in SUITES.items() if profile in s["default"]]
    out: list[dict] = []
    for tok in tokens:
        m = _TOKEN.match(tok)
        if not m:
            raise SelectError(f"filter {tok!r}: expected SUITE or SUITE:TEXT (suites: {', '.join(SUITES)})")
        name, k = m.group(1), m.group(2) or ""
        if name not in SUITES:
            raise SelectError(f"filter {tok!r}: unknown suite {name!r}; suites: {', '.join(SUITES)}")
        s = SUITES[name]
        if profile not in s.get("profiles", PROFILES):
            raise SelectError(f"suite {name!r} runs on {', '.join(s['profiles'])} runners only")
        if not (root / s["path"]).is_dir():
            raise SelectError(f"suite {name!r}: {s['path']} is not in this checkout")
        if any(o["suite"] == name and o["k"] == k for o in out):
            continue
        args = list(s["args"]) + (["-k", k] if k else [])
        setup = s["setup"][profile] if isinstance(s["setup"], dict) else s["setup"]
        out.append({"suite": name, "path": s["path"], "k": k, "args": " ".join(args),
                    "setup": " ".join(f"--only {x}" for x in setup),
                    "launch_profile": s.get("launch_profile", {}).get(profile, ""),
                    "runner": s["runner"][profile], "npus": s.get("npus", 0) if profile == "ascend" else 0, "timeout": s["timeout"],
                    "id": name + (f"-{k}" if k else "")})
        out[-1]["install"] = "ascend" if out[-1]["npus"] > 0 else "cpu"
        out[-1]["soc"] = soc_of(out[-1]["runner"])
    return out


def one_run_args(chosen: list[dict]) -> str:
    """The arguments of one ``pdchaos run`` over every chosen suite."""
    if len({c["path"] for c in chosen}) < len(chosen):
        raise SelectError("one run cannot take a suite twice with different -k texts")
    words = list(dict.fromkeys(c["path"] for c in chosen))
    limits = [SUITES[c["suite"]]["args"] for c in chosen]
    if all(limits):
        targets = dict.fromkeys(t for a in limits for t in a[1::2])
        words += [w for t in targets for w in ("--target", t)]
    ks = {c["k"] for c in chosen}
    if len(ks) > 1:
        raise SelectError("one run takes one -k text: give every suite the same :TEXT, or none")
    k = ks.pop() if ks else ""
    return " ".join(words + (["-k", k] if k else []))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m harness.ci.suites", description=__doc__.splitlines()[0])
    p.add_argument("--filter", default="", help="suites, e.g. 'SUITE,SUITE:TEXT' (the names: families/*/ci_suites.json); "
                                                     "empty or 'all': the defaults")
    p.add_argument("--profile", default="cpu", help=f"one of {', '.join(PROFILES)}")
    p.add_argument("--root", default=".", help="the checkout (default: .)")
    args = p.parse_args(argv)
    if _LOAD_ERROR:
        print(f"error: {_LOAD_ERROR}", file=sys.stderr)
        return 2
    try:
        chosen = select(args.filter, args.profile, Path(args.root))
    except SelectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    set_output("matrix", json.dumps({"include": chosen}, separators=(",", ":")))
    set_output("paths", " ".join(dict.fromkeys(c["path"] for c in chosen)))
    set_output("count", len(chosen))
    try:
        set_output("run_args", one_run_args(chosen))
    except SelectError as exc:
        set_output("run_args", "")
        print(f"note: no single-run arguments: {exc}", file=sys.stderr)
    steps = dict.fromkeys(word for c in chosen for word in c["setup"].split() if word != "--only")
    set_output("setup_args", " ".join(f"--only {x}" for x in steps))
    for c in chosen:
        print(f"selected {c['id']}: {c['path']} {c['args']} on {c['runner']} ({c['timeout']} min)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

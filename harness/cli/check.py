"""``pdchaos check RUN_DIR``: re-run the checks of a saved run offline, from its journals alone.

Prints each scenario/target's verdict and outcome and whether the verdict equals the one saved at
run time. What the checks read besides the history (expectation, check options, applicability,
the effect each fault must show) is rebuilt from the run's scenario, found by name (a history
cannot lower its own bar); a run whose scenario is not here is an error unless
``--trust-saved-meta``. A run that was skipped or ended in a harness error (its journal says so)
keeps that outcome. Exit as ``pdchaos run``: 1 on any deviation or error, and with ``--strict``
on any skipped run; else 0; 2 when RUN_DIR is not a run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..saved import check_saved
from nodekit import journal as J
from ..errors import UsageError
from nodekit.journal import iter_runs, meta
from .. import verdicts as V
from ..outputs import counts, outcome_of, run_status, tally

MARK = {"as_expected": "", "deviation": " DEVIATION", "skipped": " SKIPPED", "error": " ERROR"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="one JSON object per scenario/target")
    p.add_argument("--trust-saved-meta", action="store_true",
                   help="judge a run whose scenario is not here by its own saved meta line (its expectation, "
                        "options, faults' effects); without it such a run is an error")
    p.add_argument("--strict", action="store_true", help="a skipped scenario run fails the check: exit 1")
    p.add_argument("--as", dest="as_target", metavar="TARGET",
                   help="judge every run as if it were TARGET's: that target's expectation and options, from "
                        "the scenario file the run names (e.g. upstream's runs against hardened's claims: each "
                        "scenario that claims a hardened gain must then deviate)")


# what a saved meta line says that the checks read: rebuilt from the scenario file when it is here
FROM_FILE = ("scenario", "family", "deadline_ms", "tolerance_ms", "checks", "not_applicable", "expect", "targets",
             "baseline_target", "primary_ops", "op_kinds", "planned_ops", "topology", "workload", "faults", "triggers")


def scenario_roots() -> list[Path]:
    """Where scenario files are looked up: ``scenarios/`` of the working directory and of the
    checkout this harness belongs to (never a path a journal names)."""
    roots = []
    for r in (Path.cwd() / "scenarios", Path(__file__).resolve().parents[2] / "scenarios"):
        if r.is_dir() and r.resolve() not in roots:
            roots.append(r.resolve())
    return roots


_INDEX: dict[Path, dict[str, Path]] = {}


def _index(root: Path) -> dict[str, Path]:
    """{scenario name: file} of the YAML files under ``root`` (read once per process)."""
    if root not in _INDEX:
        import yaml

        names: dict[str, Path] = {}
        for f in sorted(root.rglob("*.yaml")):
            try:
                data = yaml.safe_load(f.read_text())
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(data, dict) and isinstance(data.get("name"), str):
                names.setdefault(data["name"], f)
        _INDEX[root] = names
    return _INDEX[root]


def _scenario_of(records: list[dict], run_dir: Path | None = None):
    """The scenario the meta line names: looked up by name among the scenario files of the working
    directory and of this checkout first; else the file the meta line names, if it is there, holds
    that scenario and lies outside the run folder (a scenario kept elsewhere, e.g. a user's own);
    None when neither is found. A file inside the run folder is never taken: a history cannot
    bring its own bar."""
    from ..schema import load_scenario

    m = meta(records)
    name = m.get("scenario")
    if not isinstance(name, str):
        return None
    for root in scenario_roots():
        f = _index(root).get(name)
        if f is not None:
            return load_scenario(f)
    path = Path(str(m.get("file") or ""))
    if not m.get("file") or not path.is_file():
        return None
    if run_dir is not None and path.resolve().is_relative_to(run_dir.resolve()):
        return None
    sc = load_scenario(path)
    return sc if sc.model.name == name else None


def judged_as(records: list[dict], target: str, run_dir: Path | None = None) -> list[dict]:
    """The records with the meta line of ``target`` instead: its expectation, applicability,
    options and faults' declared effects, read from the scenario file the meta line names (the
    current file)."""
    m = meta(records)
    sc = _scenario_of(records, run_dir)
    if sc is None:
        raise UsageError(f"--as {target}: no scenario named {m.get('scenario')!r} under "
                         f"{', '.join(str(r) for r in scenario_roots()) or 'scenarios/'}")
    if target not in sc.model.targets and target not in sc.family.targets:
        raise UsageError(f"--as {target}: {sc.path} has no target {target!r} (targets: {', '.join(sc.family.targets)})")
    return _with_meta(records, sc, target, {"judged_as_from": m.get("target")})


def _with_meta(records: list[dict], sc, target: str, extra: dict) -> list[dict]:
    from ..runner import scenario_meta

    fresh = scenario_meta(sc, target)
    new_meta = {**meta(records), **{k: fresh[k] for k in FROM_FILE}, "target": target, **extra}
    return [new_meta if r.get("type") == "meta" else r for r in records]


def judged_by_file(records: list[dict], run_dir: Path | None = None) -> tuple[list[dict], str]:
    """The records with their meta line rebuilt from the scenario file (a history cannot lower
    its own bar), and where the meta came from: ``file`` or ``saved`` (the file is not here: the
    saved line, as written by the run, is all there is)."""
    sc = _scenario_of(records, run_dir)
    target = meta(records).get("target")
    if sc is None or (target not in sc.model.targets and target not in sc.family.targets):
        return records, "saved"
    return _with_meta(records, sc, target, {}), "file"


def _not_run(records: list[dict]) -> tuple[str, str] | None:
    """(verdict, reason) when the journal records a run that never reached its checks."""
    m = meta(records)
    if m.get("skipped"):
        return "skipped", str(m["skipped"])
    if m.get("error"):
        return "error", str(m["error"])
    end = next((r for r in reversed(records) if r.get("type") == "end"), {})
    if end.get("reason") in ("error", "interrupted"):
        return "error", f"the run ended with reason {end['reason']!r} (no verdict)"
    return None


def _mismatch(records: list[dict], scenario: str, target: str) -> str | None:
    """Why the journal cannot be the run its folder says it is, if it cannot."""
    m = meta(records)
    if m.get("scenario") != scenario or m.get("target") != target:
        return (f"the journal in {scenario}/{target} is a run of {m.get('scenario')!r} [{m.get('target')!r}]: "
                f"the history is not this folder's")
    if m.get("skipped") and any(r.get("type") == "op" for r in records):
        return "the journal says the run was skipped, yet it holds ops: the history is not one run's"
    return None


def recheck(run_dir: Path, as_target: str | None = None, trust_saved_meta: bool = False) -> list[dict]:
    out = []
    for scenario, target, path in iter_runs(run_dir):
        records = J.read_journal(path)
        bad = _mismatch(records, scenario, target)
        source = "file"
        if bad is None and as_target:
            records = judged_as(records, as_target, run_dir)
        elif bad is None:
            records, source = judged_by_file(records, run_dir)
            if source == "saved" and not trust_saved_meta:
                where = ", ".join(str(r) for r in scenario_roots()) or "no scenarios/ folder"
                bad = (f"no scenario named {scenario!r} here ({where}): its expectation cannot be rebuilt, and a "
                       f"history's own meta line is not trusted (--trust-saved-meta judges by it)")
        expected = meta(records).get("expect", "pass")
        row = {"scenario": scenario, "target": target, "expected": expected, "meta_from": source}
        not_run = ("error", bad) if bad else _not_run(records)
        if not_run:
            row.update(verdict=not_run[0], reason=not_run[1], checks=[])
        else:
            results = check_saved(path, records)
            verdict, failing = V.of_results(results)
            row.update(verdict=verdict, failing=failing, reason="", checks=[r.to_dict() for r in results])
        row["outcome"] = outcome_of(row["verdict"], expected, row.get("failing"))
        if row["outcome"] == "deviation":
            row["reason"] = V.difference(row["verdict"], expected, row.get("failing"))
        out.append(row)
    summary = run_dir / "summary.json"
    if summary.is_file():  # a run the summary lists whose journal is gone is not a pass by omission
        have = {(r["scenario"], r["target"]) for r in out}
        for r in json.loads(summary.read_text()).get("results", []):
            key = (r.get("scenario"), r.get("target"))
            if key not in have and r.get("verdict") not in ("skipped",) and r.get("dir"):
                out.append({"scenario": key[0], "target": key[1], "expected": r.get("expected", ""), "meta_from": "",
                            "verdict": "error", "outcome": "error", "checks": [],
                            "reason": "summary.json lists this run, but its journal is not in the run folder"})
    return out


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run folder")
    saved = {}
    summary = run_dir / "summary.json"
    if summary.exists():
        for r in json.loads(summary.read_text()).get("results", []):
            saved[(r["scenario"], r["target"])] = r.get("verdict")
    rows = recheck(run_dir, getattr(args, "as_target", None), getattr(args, "trust_saved_meta", False))
    if not rows:
        raise UsageError(f"{run_dir}: no journals (*/*/journal.jsonl) in this folder")
    for row in rows:
        same = saved.get((row["scenario"], row["target"]))
        if args.json:
            print(json.dumps({**row, "saved_verdict": same}))
            continue
        note = "" if same is None else (" (same as saved)" if same == row["verdict"] else f" (saved: {same})")
        if row.get("meta_from") == "saved":
            note += " (no such scenario here: judged by the run's saved meta line, --trust-saved-meta)"
        print(f"{row['scenario']} [{row['target']}] {row['verdict']}, expected {row['expected']}"
              f"{MARK[row['outcome']]}{note}" + (f": {row['reason']}" if row["reason"] else ""))
        for c in row["checks"]:
            if c["ok"] is False:
                print(f"    {c['name']}: {c['message']}")
        na = [c["name"] for c in row["checks"] if c["ok"] is None]
        if na:
            print(f"    n/a (not applicable): {', '.join(na)}")
    outcomes = [row["outcome"] for row in rows]
    code, why = run_status(outcomes, strict=args.strict)
    if not args.json:
        print(f"{len(rows)} scenario runs: {tally(counts(outcomes))}")
        print(why)
    return code

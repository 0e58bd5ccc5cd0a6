"""The report folder of ``pdchaos repro``: README.md and what it links, from one finished run.

Pure functions of the run folder (its summary.json, the scenario/target journal, its checks and
plots) and of facts the command gathered (the environment, the family's steps); the command
(harness/cli/repro.py) runs the scenario and calls :func:`write_folder`. Nothing here names a
family: the family's own words come in ``steps`` (``Family.repro_steps``) and the journal.

What the folder never holds: prompts, outputs, token ids or their digests, keys, block hashes, raw
frames, request ids. The journal excerpt keeps, per record type, an allow-list of fields (an op:
its kind, phase, outcome, code, status, phase of error, elapsed ms and token count; an event: its
short scalar fields), with times relative to the run's start; a check's message has its op ids
withheld.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

from harness import verdicts as V
from nodekit import journal as J

from . import data as D
from . import timeline as T

EXCERPT_FILE = "journal-excerpt.jsonl"
EXCERPT_LINES = 40  # inlined in README.md (the file holds them all)
OP_FIELDS = ("f", "phase", "outcome", "code", "status", "error_phase", "elapsed_ms", "completion_tokens")
FAULT_FIELDS = ("id", "name", "phase", "healed_by", "tail_s")
PROBE_FIELDS = ("node", "kind", "when", "threads", "fds", "alive")
META_FIELDS = ("scenario", "family", "target", "targets", "baseline_target", "deadline_ms", "tolerance_ms", "seed",
               "cap_s", "expect", "wall_start")
_OP_IDS = re.compile(r"\b(ops?|requests?|ids?)\s*[#:=]?\s*(\[[\d,\s]*\]|\d+(?:\s*,\s*\d+)*)", re.IGNORECASE)


# ------------------------------------------------------------------ the journal, as the folder may show it

def _safe_scalar(v: Any) -> Any:
    """A number or bool as it is; a string only when it is short and looks like no key, path or
    token run; anything else: left out (None)."""
    if isinstance(v, bool) or isinstance(v, (int, float)):
        return v
    return T.safe_text(v) if isinstance(v, str) else None


def _safe_params(params: Any) -> dict:
    return {str(k): s for k, v in (params or {}).items() if (s := _safe_scalar(v)) is not None} \
        if isinstance(params, dict) else {}


def excerpt_record(r: dict, t0: float) -> dict | None:
    """One journal record as the excerpt keeps it (None: nothing of it may be shown)."""
    typ = r.get("type")
    t = r.get("t")
    rel = {"t_s": round(float(t) - t0, 3)} if isinstance(t, (int, float)) and not isinstance(t, bool) else {}
    if typ == "meta":
        out = {"type": "meta", **{k: r[k] for k in META_FIELDS if k in r}}
        out["faults"] = [{"id": f.get("id"), "type": f.get("type"), "at": f.get("at"), "for": f.get("for"),
                          "params": _safe_params(f.get("params"))} for f in r.get("faults") or [] if isinstance(f, dict)]
        return out
    if typ == "op":
        keep = {k: s for k in OP_FIELDS if k in r and (s := _safe_scalar(r[k])) is not None}
        return {"type": "op", **rel, **keep}
    if typ == "fault":
        keep = {k: s for k in FAULT_FIELDS if k in r and (s := _safe_scalar(r[k])) is not None}
        return {"type": "fault", **rel, **keep, **({"params": _safe_params(r["params"])} if "params" in r else {})}
    if typ == "event":
        keep = {}
        for k, v in r.items():
            if k in ("type", "t", "pid", "argv", "env", "what"):
                continue
            if isinstance(v, dict):
                flat = {f"{k}.{a}": b for a, b in T._flat(v).items()}
                keep.update({a: b for a, b in flat.items() if _safe_scalar(b) is not None})
            elif (s := _safe_scalar(v)) is not None:
                keep[k] = s
        return {"type": "event", **rel, "what": T.safe_text(r.get("what"), 40) or "event", **keep}
    if typ == "probe":
        if r.get("when") == "sample":
            return None  # the gauges plot shows the samples; the excerpt keeps the baseline, last and final
        keep = {k: s for k in PROBE_FIELDS if k in r and (s := _safe_scalar(r[k])) is not None}
        return {"type": "probe", **rel, **keep, "counters": T._flat(r.get("counters"))}
    if typ == "end":
        return {"type": "end", **rel, **{k: r[k] for k in ("reason", "stalled") if k in r}}
    return None


def journal_excerpt(records: Sequence[dict], secrets: Sequence[str] = ()) -> list[dict]:
    """The records the folder may show (see :func:`excerpt_record`); a record that still holds any
    of ``secrets`` (the family's: prompts, keys) is dropped whole."""
    t0 = D.t0_of(list(records))
    low = [s.lower() for s in secrets if len(s) >= 8]
    out = []
    for r in records:
        e = excerpt_record(r, t0)
        if e is None:
            continue
        text = json.dumps(e, ensure_ascii=False).lower()
        if any(s in text for s in low):
            continue
        out.append(e)
    return out


def withhold_ids(message: str) -> str:
    """A check's message without the op ids it names ("op 81 took 503 ms" -> "op (id withheld) took ...")."""
    text = _OP_IDS.sub(lambda m: f"{m.group(1)} (id withheld)", str(message))
    for pat in T._SECRET_LIKE:  # a key-like or token-like run (a check never says one; if it did)
        text = pat.sub("<withheld>", text)
    return text


# ------------------------------------------------------------------ README.md

def _md(s: Any) -> str:
    return " ".join(str(s).split()).replace("|", "\\|")


def _code(lines: Sequence[str], lang: str = "") -> list[str]:
    return [f"```{lang}", *lines, "```"]


def measured(details: Any) -> str:
    """A check's numeric details (``worst_ms 20100.9``), never its lists of op ids."""
    if not isinstance(details, dict):
        return ""
    bits = [f"{k} {T._num(v)}" for k, v in details.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and "id" not in k.lower()]
    return ", ".join(bits[:6])


def expected_vs_actual(meta: dict, target: str, result: dict, scenario_expect: dict[str, str]) -> list[str]:
    """The claim (the scenario's expectation for its claiming targets: every target but the
    baseline) next to what this target did, check by check, with the checks' measured numbers."""
    baseline = meta.get("baseline_target")
    targets = [t for t in (meta.get("targets") or [target]) if isinstance(t, str)]
    claimers = [t for t in targets if t != baseline] or [target]
    verdict, expected = str(result.get("verdict", "?")), str(result.get("expected", ""))
    failing = sorted(c.get("name") for c in result.get("checks") or [] if c.get("ok") is False)
    outcome = V.outcome(verdict, expected, failing) if expected else "?"
    lines = [f"- **{_md(target)}** (this run): verdict **{_md(verdict)}**"
             + (f", failing: {', '.join(f'`{c}`' for c in failing)}" if failing else "")
             + f"; the scenario expects of it: {_md(V.words(expected)) if expected else 'nothing'}"
             + f" -> **{'as expected' if outcome == 'as_expected' else outcome.upper()}**."]
    for c in claimers:
        if c == target:
            continue
        lines.append(f"- **{_md(c)}** (the claim): the scenario expects {_md(V.words(scenario_expect.get(c, '')) or '?')}.")
    lines += ["", "| check | " + " | ".join(f"claim of {_md(c)}" for c in claimers if c != target)
              + (" | " if [c for c in claimers if c != target] else "") + f"{_md(target)}: result | measured |",
              "|---|" + "---|" * len([c for c in claimers if c != target]) + "---|---|"]
    for chk in result.get("checks") or []:
        name = str(chk.get("name", "?"))
        cells = []
        for c in claimers:
            if c == target:
                continue
            exp = scenario_expect.get(c, "")
            named = re.findall(r"\[([^\]]*)\]", exp)
            may_fail = any(name in [x.strip() for x in grp.split(",")] for grp in named)
            cells.append("may fail" if may_fail else ("must hold" if exp else "?"))
        ok = chk.get("ok")
        res = {True: "holds", False: "VIOLATED", None: "n/a"}.get(ok, "?")
        lines.append(f"| `{_md(name)}` | " + "".join(f"{x} | " for x in cells)
                     + f"{res}: {_md(withhold_ids(chk.get('message', '')))} | {_md(measured(chk.get('details')))} |")
    return lines


def readme(*, scenario: str, target: str, family: str, command: str, scenario_file: str, scenario_yaml: str,
           description: str, env: dict, launches: list[dict], steps: list[tuple[str, str]],
           fault_steps: list[tuple[str, str]], meta: dict, result: dict, scenario_expect: dict[str, str],
           incident: T.Incident, plots: list[str], excerpt: list[dict], run_rel: str) -> str:
    L: list[str] = [f"# Repro: {scenario} on {target}", ""]
    L += [f"{_md(description)}" if description else "", "",
          f"Family `{family}`; scenario file `{scenario_file}`; run folder `{run_rel}` (journal, logs, checks, "
          "report.html); made by:", "", *_code([command], "bash"), ""]
    # environment
    L += ["## Environment", ""]
    for label, key in (("pd-chaos", "pdchaos"), ("Python (harness)", "python"), ("OS", "os"), ("kernel", "kernel"),
                       ("CPU", "cpu"), ("cores", "cores"), ("memory", "memory")):
        if env.get(key):
            L.append(f"- {label}: {_md(env[key])}")
    for e in env.get("node_envs") or []:
        vers = ", ".join(f"{k} {v}" for k, v in sorted((e.get("versions") or {}).items())) or "none of vLLM, " \
            "vllm-ascend, Mooncake, torch"
        L.append(f"- node env `{e.get('path')}`{' (this run used it)' if e.get('used') else ''}: {vers}")
    if env.get("node_envs") is not None and not any(e.get("used") for e in env.get("node_envs") or []):
        L.append("- no node env's path is in this run's logs: its nodes ran on the harness's Python (above)")
    wanted = env.get("wanted") or ()
    found = {k.lower().replace("_", "-") for e in env.get("node_envs") or [] for k in (e.get("versions") or {})}
    missing = [w for w in wanted if not any(f == w or f.startswith(w + "-") for f in found)]
    if missing:
        L.append(f"- not installed in any node env of the family: {', '.join(missing)}")
    L.append("")
    # launch commands
    L += ["## How the harness started each node", "",
          "As the run's journal recorded them (`process_start`), the harness's paths relative to its checkout, "
          "`~` or `$TMPDIR`:", ""]
    if launches:
        for x in launches:
            L += [f"- `{_md(x['role'])}` at {T.fmt_s(x.get('t'))} s:", "", *_code([x["command"]], "bash"), ""]
    else:
        L += ["(the journal recorded no launch command: a run made before pd-chaos recorded them)", ""]
    # steps
    L += ["## Steps", "", "Without pd-chaos, where a command exists:", ""]
    for what, cmd in steps + fault_steps:
        L.append(f"- {_md(what)}")
        if cmd:
            L += ["", *_code([cmd], "bash"), ""]
    if not steps and not fault_steps:
        L.append("- (the family names no step outside pd-chaos)")
    L += ["", "With pd-chaos: the scenario file (also `scenario.yaml` here) and the one command above.", "",
          *_code(scenario_yaml.rstrip("\n").splitlines(), "yaml"), ""]
    # expected vs actual
    L += ["## Expected vs actual", "", *expected_vs_actual(meta, target, result, scenario_expect), ""]
    # timeline
    L += ["## Incident timeline", "", "Times in seconds since the run's start (the workload's start signal).", "",
          *T.markdown(incident), ""]
    # plots
    if plots:
        L += ["## Plots", ""]
        L += [f"![{_md(p)}]({p})" for p in plots] + [""]
    # excerpt
    L += ["## Journal excerpt", "",
          f"The records around the incident (`{EXCERPT_FILE}` holds every record the log policy allows: no "
          "prompt, output, token id, key, block hash, raw frame or request id; samples are in the gauges plot):", ""]
    L += _code([json.dumps(e, ensure_ascii=False, separators=(",", ":")) for e in excerpt_window(excerpt, incident)],
               "json")
    L.append("")
    return "\n".join(x for x in L) + "\n"


def excerpt_window(excerpt: list[dict], incident: T.Incident, n: int = EXCERPT_LINES) -> list[dict]:
    """The meta line, then up to ``n`` records from half a second before the first fault (or
    failure) on: every fault, event, probe and end record, the op completions that were not a
    timely success, and the first success after each heal (the file holds every op)."""
    t_first = min([e.t for e in incident.entries if e.stage in ("fault", "failure", "late") and e.t is not None],
                  default=0.0)
    heal_s = sorted(e.t for e in incident.entries if e.stage == "healed" and e.t is not None)
    body, next_heal = [], 0
    limit = incident.limit_ms
    for e in excerpt:
        if e.get("type") == "meta" or e.get("t_s", 0.0) < t_first - 0.5:
            continue
        if e.get("type") == "probe":  # its counters are in the file; here only how many
            body.append({**{k: v for k, v in e.items() if k != "counters"}, "counters": len(e.get("counters") or {})})
            continue
        if e.get("type") != "op":
            body.append(e)
            continue
        if e.get("phase") == "invoke":
            continue
        timely = e.get("phase") == "ok" and (limit is None or (e.get("elapsed_ms") or 0.0) <= limit)
        if not timely:
            body.append(e)
        elif next_heal < len(heal_s) and e.get("t_s", 0.0) >= heal_s[next_heal]:
            body.append(e)  # the first success after a heal
            while next_heal < len(heal_s) and heal_s[next_heal] <= e.get("t_s", 0.0):
                next_heal += 1
    return [e for e in excerpt if e.get("type") == "meta"][:1] + body[:n]


def copy_plots(run_dir: Path, scenario: str, target: str, out: Path) -> list[str]:
    """The run's plots of this scenario and target, copied into ``out/plots``; relative paths."""
    from .build import PLOTS_DIR, _safe

    src = run_dir / PLOTS_DIR
    rels = []
    prefix = f"{_safe(scenario)}--{_safe(target)}"
    for p in sorted(src.glob(f"{prefix}*.png")) if src.is_dir() else []:
        (out / "plots").mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, out / "plots" / p.name)
        rels.append(f"plots/{p.name}")
    return rels


def launches_of(records: Sequence[dict], t0: float) -> list[dict]:
    """Every node the harness started in this run, as the journal's ``process_start`` records say:
    its role and its command line (with its environment variables), in start order."""
    import shlex

    out = []
    for r in records:
        if r.get("type") != "event" or r.get("what") != "process_start" or not isinstance(r.get("argv"), list):
            continue
        env = r.get("env") if isinstance(r.get("env"), dict) else {}
        cmd = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())
        cmd = (cmd + " " if cmd else "") + shlex.join(str(a) for a in r["argv"])
        t = r.get("t")
        out.append({"role": str(r.get("role") or r.get("kind") or "?"), "command": cmd,
                    "t": float(t) - t0 if isinstance(t, (int, float)) else None})
    return out


_HOME_PY = re.compile(r"(?<![\w.~$<])/\S*?/bin/python(?:3(?:\.\d+)?)?(?![\w.])")
_TMP = re.compile(r"(?<![\w.~$<])/tmp/")


def machine_paths(text: str, checkout: Path | None = None) -> str:
    """A report names no path of the machine it was made on: the checkout's own paths become
    relative to it, the harness's Python ``python3``, the home folder ``~`` (the node env and the
    model then read ``~/.cache/pdchaos/...``, the cache's default place), ``/tmp/`` ``$TMPDIR/``."""
    root = str(checkout or Path(__file__).resolve().parents[1])
    # the interpreter first: a venv inside the checkout (``.venv/bin/python``) is the harness's Python too
    text = _HOME_PY.sub(lambda m: m.group(0) if "/.cache/pdchaos/" in m.group(0) else "python3", text)
    text = text.replace(root + "/", "").replace(root, ".")
    home = str(Path.home())
    if home not in ("", "/"):
        text = re.sub(r"(?<![\w.~$<])" + re.escape(home) + r"(?=/|\b)", "~", text)
    return _TMP.sub("$TMPDIR/", text)


def write_folder(out: Path, run_dir: Path, scenario: str, target: str, *, command: str, scenario_file: Path,
                 description: str, env: dict, steps: list[tuple[str, str]], fault_steps: list[tuple[str, str]],
                 scenario_expect: dict[str, str], secrets: Sequence[str] = ()) -> Path:
    """README.md, scenario.yaml, journal-excerpt.jsonl, plots/ and report.html in ``out``."""
    jp = run_dir / scenario / target / "journal.jsonl"
    records = J.read_journal(jp)
    meta = J.meta(records)
    t0 = D.t0_of(records)
    summary = json.loads((run_dir / "summary.json").read_text())
    result = next(r for r in summary.get("results", []) if r.get("scenario") == scenario and r.get("target") == target)
    incident = T.incident_timeline(records)
    excerpt = journal_excerpt(records, secrets)
    with open(out / EXCERPT_FILE, "w", encoding="utf-8") as fh:
        for e in excerpt:
            fh.write(json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n")
    yaml_text = Path(scenario_file).read_text()
    (out / "scenario.yaml").write_text(yaml_text)
    plots = copy_plots(run_dir, scenario, target, out)
    if (run_dir / "report.html").is_file():
        shutil.copy2(run_dir / "report.html", out / "report.html")
    try:
        run_rel = str(run_dir.relative_to(out))
    except ValueError:
        run_rel = str(run_dir)
    text = readme(scenario=scenario, target=target, family=str(meta.get("family", "?")), command=command,
                  scenario_file=str(scenario_file), scenario_yaml=yaml_text, description=description, env=env,
                  launches=launches_of(records, t0), steps=steps, fault_steps=fault_steps, meta=meta, result=result,
                  scenario_expect=scenario_expect, incident=incident, plots=plots, excerpt=excerpt, run_rel=run_rel)
    (out / "README.md").write_text(machine_paths(text), encoding="utf-8")
    return out / "README.md"

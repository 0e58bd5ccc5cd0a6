"""``pdchaos measure``: the one measurement behind every figure the README states.

Run on a fresh clone, it does what a new user does, in order, timing each with the wall clock:

1. ``python3 -m pip install -e '.[dev]'`` (``install_s``);
2. ``pdchaos setup`` (``setup_s``; with ``--cold``, in an empty cache folder of its own, so the node
   stack is downloaded and installed as on a fresh machine; each step's own time is kept);
3. ``pdchaos run scenarios/pd/ --quick`` (``quick_s``, its runs and outcomes);
4. ``pdchaos run scenarios/pd/ --strict`` (the main job: ``main_s``, runs, as expected, exit code,
   and a few of its lines for the README's sample);
5. ``pdchaos setup --all`` then ``python -m pytest`` with ``PDCHAOS_REQUIRE_ALL=1`` (``tests_s``,
   passed, failed, skipped);
6. the size of each node env.

It writes ``docs/measurements.json`` (the numbers, the commit, the machine), the table at the top of
``docs/measurements.md`` and every README figure between ``<!-- measured:KEY -->`` and
``<!-- /measured -->``. ``tests/harness/test_measurements.py`` fails when the README states a
figure outside those marks, or one the measurement does not have. Each step has a timeout; a step
that fails is recorded with its exit code and the figures it did produce (never a made-up one).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .nodeenv.venv import cache_root, tree_bytes

ROOT = Path(__file__).resolve().parents[1]
JSON = Path("docs/measurements.json")
MD = Path("docs/measurements.md")
README = Path("README.md")
MARK = re.compile(r"<!-- measured:([a-z0-9_]+) -->(.*?)<!-- /measured -->", re.S)
TABLE_BEGIN, TABLE_END = "<!-- measurements:begin -->", "<!-- measurements:end -->"
# A figure the README could state: a time, a size, or a count of runs/tests/scenarios.
FIGURE = re.compile(r"\b\d+(?:[.,]\d+)?\s?(?:s|sec|seconds?|min|minutes?|h|hours?|GB|MB|GiB|MiB)\b"
                    r"|\b\d+\s(?:runs?|tests?|scenarios?)\b")

STEP_TIMEOUTS_S = {"install": 900, "setup": 3600, "quick": 1200, "main": 3600, "setup_all": 3600, "tests": 3600}


class MeasureError(Exception):
    """One line: which step could not be measured and why."""


@dataclass
class Timed:
    rc: int
    seconds: float
    out: str


def run_timed(cmd: list[str], timeout: float, env: dict[str, str] | None = None, echo: Callable[[str], None] = print,
              cwd: Path = ROOT) -> Timed:
    """Run ``cmd`` (its output shown as it comes and kept); the wall time and exit code."""
    echo("$ " + " ".join(cmd))
    t0 = time.monotonic()
    lines: list[str] = []
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, stdin=subprocess.DEVNULL, start_new_session=True, errors="replace")

    def read() -> None:  # in a thread: a command that prints nothing still meets its deadline
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            echo("  " + lines[-1])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise MeasureError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from None
    except KeyboardInterrupt:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise MeasureError(f"`{' '.join(cmd)}` interrupted") from None
    seconds = round(time.monotonic() - t0, 1)  # the command's own time, not a child left holding its output
    reader.join(5.0)
    return Timed(proc.returncode, seconds, "\n".join(lines))


# --------------------------------------------------------------------------- parsing what was printed

_TALLY = re.compile(r"(\d+) scenario runs in ([\d.]+)s: (\d+) as expected, (\d+) deviations, (\d+) skipped, "
                    r"(\d+) errors")
_PYTEST = re.compile(r"^[=\s]*(.*?) in ([\d.]+)s\b", re.M)  # with or without -q's missing "=" rule
_STEP = re.compile(r"^setup: (\S+) \.\.\. (.*) \[([\d.]+) s\]$", re.M)


def parse_tally(out: str) -> dict:
    """The runner's last ``N scenario runs in Xs: ...`` line."""
    found = _TALLY.findall(out)
    if not found:
        return {}
    runs, secs, ok, dev, skipped, errors = found[-1]
    return {"runs": int(runs), "runs_s": float(secs), "as_expected": int(ok), "deviations": int(dev),
            "skipped": int(skipped), "errors": int(errors)}


def parse_pytest(out: str) -> dict:
    """pytest's closing line: counts by outcome and its own time."""
    found = [m for m in _PYTEST.finditer(out) if re.search(r"\d+ (passed|failed|error)", m.group(1))]
    if not found:
        return {}
    words = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", found[-1].group(1)))
    return {"passed": words.get("passed", 0), "failed": words.get("failed", 0),
            "skipped": words.get("skipped", 0), "errors": words.get("error", 0) + words.get("errors", 0),
            "pytest_s": float(found[-1].group(2))}


def parse_setup_steps(out: str) -> dict[str, float]:
    return {name: float(secs) for name, _what, secs in _STEP.findall("\n".join(
        ln.strip() for ln in out.splitlines()))}


def sample_lines(out: str, want: int = 6) -> list[str]:
    """A few of the main job's verdict lines for the README: one per outcome kind first, then the tally."""
    verdicts = [ln.strip() for ln in out.splitlines() if re.match(r"\s*\[\d+/\d+\] ", ln)]
    picked: list[str] = []
    for pattern in (r"\[upstream\] stall", r"\[upstream\] fail", r"\[hardened\] pass", r"\[upstream\] pass"):
        hit = next((ln for ln in verdicts if re.search(pattern, ln) and ln not in picked), None)
        if hit:
            picked.append(hit)
    for ln in verdicts:
        if len(picked) >= want - 1:
            break
        if ln not in picked and "[hardened]" in ln:
            picked.append(ln)
    picked.sort(key=lambda ln: int(re.match(r"\[(\d+)/", ln).group(1)))
    tally = [ln.strip() for ln in out.splitlines() if _TALLY.search(ln)]
    return picked + tally[-1:]


def env_sizes(cache: Path) -> dict[str, float]:
    """GB (10^9 bytes, apparent size, hard links counted once) of each node env under ``cache``."""
    out = {}
    envs = cache / "envs"
    for d in sorted(envs.glob("*")) if envs.is_dir() else []:
        if d.is_dir() and (d / "stamp.json").is_file():
            total = tree_bytes(d)
            try:
                name = json.loads((d / "stamp.json").read_text()).get("name", d.name)
            except (OSError, ValueError):
                name = d.name
            out[name] = round(total / 1e9, 1)
    return out


# --------------------------------------------------------------------------- formatting

def minutes(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def figures(m: dict) -> dict[str, str]:
    """The README's figures, by key, as the README prints them; a step whose output could not be
    read has none (then the README's marks for it name what is missing: MeasureError)."""
    try:
        return _figures(m)
    except (KeyError, TypeError) as exc:
        raise MeasureError(f"the measurement lacks {exc} (a command's closing line was not found in its "
                           "output)") from None


def _figures(m: dict) -> dict[str, str]:
    f: dict[str, str] = {}
    if "setup_s" in m:
        f["setup"] = minutes(m["setup_s"]) + (" with empty caches" if m.get("cold") else "")
        for name, secs in m.get("setup_steps", {}).items():
            f["setup_step_" + name.replace("-", "_")] = minutes(secs)
    if "quick_s" in m:
        f["quick"] = minutes(m["quick_s"])
        f["quick_runs"] = f"{m['quick']['runs']} runs"
    if "main_s" in m:
        f["main"] = minutes(m["main_s"])
        f["main_runs"] = f"{m['main']['runs']} runs"
        f["main_sample"] = "\n".join(["```text", f"$ {m.get('main_cmd', 'pdchaos run')} --plain",
                                       *m.get("main_sample", []), "```"])
    if "tests_s" in m:
        f["tests"] = minutes(m["tests_s"])
        f["tests_count"] = f"{m['tests']['passed'] + m['tests']['failed'] + m['tests'].get('errors', 0)} tests"
    for name, gb in m.get("env_gb", {}).items():
        f[f"env_{name.replace('-', '_')}"] = f"{gb} GB"
    f["when"] = f"{m.get('date', '?')} at {m.get('commit', '?')}"
    return f


def fill_readme(text: str, figs: dict[str, str]) -> str:
    """Every ``<!-- measured:KEY -->...<!-- /measured -->`` in ``text`` with its figure; a KEY
    with none is a MeasureError (the README would state what was not measured)."""
    def sub(m: re.Match) -> str:
        key = m.group(1)
        if key not in figs:
            raise MeasureError(f"README.md names the figure {key!r}, which this measurement does not have")
        value = figs[key]
        if "\n" in value or "\n" in m.group(2):
            value = "\n" + value + "\n"
        return f"<!-- measured:{key} -->{value}<!-- /measured -->"
    return MARK.sub(sub, text)


def table(m: dict) -> str:
    rows = [("when", f"{m.get('date')} at commit {m.get('commit')}, {m.get('machine')}"),
            ("`pip install -e '.[dev]'`", minutes(m["install_s"]) if "install_s" in m else "not measured")]
    if "setup_s" in m:
        steps = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(m.get("setup_steps", {}).items()))
        rows.append(("`pdchaos setup`" + (" (empty node-env and uv caches: every Python download and install; toxiproxy, iptables and iproute2 "
                                       "are system-wide and were there)" if m.get("cold") else ""),
                     f"{minutes(m['setup_s'])} ({steps})"))
    for key in ("quick", "main"):
        what = f"`{m.get(key + '_cmd', key)}`"
        if f"{key}_s" in m:
            t = m[key]
            rows.append((what, f"{minutes(m[f'{key}_s'])}: {t.get('runs')} runs, {t.get('as_expected')} as expected, "
                               f"{t.get('deviations')} deviations, {t.get('errors')} errors, exit {t.get('rc')}"))
    if "setup_all_s" in m:
        rows.append(("`pdchaos setup --all`", minutes(m["setup_all_s"])))
    if "tests_s" in m:
        t = m["tests"]
        rows.append(("`PDCHAOS_REQUIRE_ALL=1 python -m pytest`", f"{minutes(m['tests_s'])}: {t.get('passed')} passed, "
                     f"{t.get('failed')} failed, {t.get('skipped')} skipped, exit {t.get('rc')}"))
    for name, gb in m.get("env_gb", {}).items():
        rows.append((f"node env `{name}` on disk", f"{gb} GB"))
    if m.get("bootstrap"):
        rows.insert(1, ("not one measurement", m["bootstrap"] + ": " + "; ".join(
            f"{k}: {v}" for k, v in sorted(m.get("sources", {}).items()))))
    body = "\n".join(f"| {a} | {b} |" for a, b in rows)
    return (f"{TABLE_BEGIN}\n## The last measurement (`pdchaos measure`, written by it)\n\n| what | figure |\n"
            f"|---|---|\n{body}\n{TABLE_END}")


def fill_md(text: str, m: dict) -> str:
    new = table(m)
    if TABLE_BEGIN in text and TABLE_END in text:
        a, b = text.index(TABLE_BEGIN), text.index(TABLE_END) + len(TABLE_END)
        return text[:a] + new + text[b:]
    head, sep, rest = text.partition("\n\n")
    return head + "\n\n" + new + "\n\n" + rest if sep else text + "\n\n" + new + "\n"


def readme_figures_outside_marks(text: str) -> list[str]:
    """Figures the README states outside ``measured`` marks (code blocks included)."""
    bare = MARK.sub("", text)
    bare = re.sub(r"(\[[^\]]*\])\([^)]*\)", r"\1", bare)  # a link's target names a file, its text may state a figure
    return sorted({m.group(0) for m in FIGURE.finditer(bare)})


# --------------------------------------------------------------------------- the measurement

def readme_command(which: str, text: str | None = None) -> list[str]:
    """The README's own command for ``which``: ``main`` is the ``pdchaos run`` of its first bash
    block (set-up and main job), ``quick`` the ``pdchaos run ... --quick`` it names. Measuring the
    README's words, not a copy of them, is what keeps the two from drifting."""
    text = (ROOT / README).read_text() if text is None else text
    if which == "main":
        block = re.search(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S)
        body = (block.group(1) if block else "").replace("\\\n", " ")
        found = None
        for line in body.splitlines():
            words = shlex.split(line.replace(";", " ; "), comments=True)
            parts = [[]]
            for w in words:
                if w in ("&&", ";"):
                    parts.append([])
                else:
                    parts[-1].append(w)
            found = found or next((p for p in parts if p[:2] == ["pdchaos", "run"]), None)
    else:
        hit = re.search(r"`(pdchaos run [^`]*--quick[^`]*)`", text)
        found = shlex.split(hit.group(1)) if hit else None
    if not found:
        raise MeasureError(f"README.md names no {which} command (`pdchaos run ...`)")
    return list(found)

def measure(steps: list[str], cold: bool, echo: Callable[[str], None] = print) -> dict:
    py = sys.executable
    cli = [py, "-m", "harness.cli"]
    m: dict = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
               f"Python {platform.python_version()}"}
    try:
        m["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                     text=True, timeout=10).stdout.strip() or "?"
        m["uncommitted_changes"] = bool(subprocess.run(["git", "status", "--porcelain"], cwd=ROOT,
                                                       capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        m["commit"] = "?"
    env = dict(os.environ)
    cold_dir = None
    if "install" in steps:
        r = run_timed([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-e", ".[dev]"],
                      STEP_TIMEOUTS_S["install"], echo=echo)
        m["install_s"], m["install_rc"] = r.seconds, r.rc
    try:
        if "setup" in steps:
            setup_env = env
            if cold:
                cold_dir = Path(tempfile.mkdtemp(prefix="pdchaos-measure-cold-"))
                setup_env = {**env, "XDG_CACHE_HOME": str(cold_dir), "UV_CACHE_DIR": str(cold_dir / "uv")}
                m["cold"] = True
            r = run_timed([*cli, "setup"], STEP_TIMEOUTS_S["setup"], env=setup_env, echo=echo)
            m["setup_s"], m["setup_rc"], m["setup_steps"] = r.seconds, r.rc, parse_setup_steps(r.out)
            if cold_dir is not None:
                m["env_gb"] = env_sizes(cold_dir / "pdchaos")
                shutil.rmtree(cold_dir, ignore_errors=True)
                cold_dir = None
                # the measured set-up was in a folder of its own: the usual cache is set up (or found) now
                run_timed([*cli, "setup"], STEP_TIMEOUTS_S["setup"], env=env, echo=echo)
        for key in ("quick", "main"):
            if key in steps:
                argv = readme_command(key)
                m[f"{key}_cmd"] = " ".join(argv)
                r = run_timed([*cli, *argv[1:], "--plain"], STEP_TIMEOUTS_S[key], env=env, echo=echo)
                m[f"{key}_s"], m[key] = r.seconds, {**parse_tally(r.out), "rc": r.rc}
                if key == "main":
                    m["main_sample"] = sample_lines(r.out)
        if "tests" in steps:
            r = run_timed([*cli, "setup", "--all"], STEP_TIMEOUTS_S["setup_all"], env=env, echo=echo)
            m["setup_all_s"], m["setup_all_rc"] = r.seconds, r.rc
            r = run_timed([py, "-m", "pytest", "-p", "no:cacheprovider", "-q"], STEP_TIMEOUTS_S["tests"],
                          env={**env, "PDCHAOS_REQUIRE_ALL": "1"}, echo=echo)
            m["tests_s"], m["tests"] = r.seconds, {**parse_pytest(r.out), "rc": r.rc}
    finally:
        if cold_dir is not None:
            shutil.rmtree(cold_dir, ignore_errors=True)
    if "env_gb" not in m:
        m["env_gb"] = env_sizes(cache_root())
    return m


def write(m: dict, root: Path = ROOT) -> list[Path]:
    """docs/measurements.json, the table in docs/measurements.md, the README's marked figures: all
    three from this one measurement, computed before any is written (a figure the README names and
    the measurement lacks changes none of them)."""
    md = root / MD
    readme = root / README
    new_md = fill_md(md.read_text() if md.is_file() else "# Measured here (2 shared cores)\n", m)
    new_readme = fill_readme(readme.read_text(), figures(m))
    (root / JSON).write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    md.write_text(new_md)
    readme.write_text(new_readme)
    return [root / JSON, md, readme]

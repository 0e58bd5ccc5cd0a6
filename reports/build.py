"""``generate(run_dir)``: load the run, render every plot, write the summaries."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from . import data as D
from . import gauge_plots as GP
from . import plots as P
from . import summary as S
from .load import Run, load_run
from .page import GAUGES_SUFFIX, report_html
from .tables import expected_words, outcome_words

PLOTS_DIR = "plots"
log = logging.getLogger("reports")


def _safe(name: str) -> str:
    """A file-name-safe form of a scenario or target name (they come from folder names already)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "_"


def _subtitle(r) -> str:
    parts = [f"verdict {r.verdict}"]
    if r.expected:
        parts.append(f"expected {expected_words(r.expected)}")
    if r.outcome is not None:
        parts.append({"as_expected": "as expected"}.get(r.outcome, r.outcome.upper()))
    st = r.stats
    if st is not None:
        failed = r.timeline.failed_words[0] if r.timeline is not None else D.GENERIC_FAILED_WORDS[0]
        parts.append(f"{st.n} ops, {st.fail_open} {failed}, {st.errors} errors, {st.stalls} stalled")
    return " · ".join(parts)


def plan(run: Run) -> tuple[list[tuple], dict[str, list[str]], str | None]:
    """The plots to draw: (job list, scenario -> relative paths, bench plot relative path).

    Per scenario: for each (after, before) pair of its targets, a before/after plot (one pair:
    ``<s>--before-after.png``; several: ``<s>--before-after--<after>.png``), then one timeline per
    target, the baseline first, each followed by that target's node gauges (``<s>--<t>--gauges.png``)
    when its family declares gauges and its journal has samples of them. A skipped run has nothing
    to draw."""
    jobs: list[tuple] = []
    rels: dict[str, list[str]] = {}
    for s in run.scenarios():
        results = [run.get(s, t) for t in run.plot_targets(s)]
        tls = {r.target: r for r in results if r is not None and r.timeline is not None and r.outcome != "skipped"}
        if not tls:
            continue
        # One bucket width and one y range per scenario, so its plots compare at a glance.
        end = max(r.timeline.end for r in tls.values())
        bucket = D.nice_bucket(end)
        ylim = D.y_limits([r.timeline for r in tls.values()])
        out = rels.setdefault(s, [])
        pairs = run.layout(s).pairs
        for a, b in pairs:
            if a not in tls or b not in tls:
                continue
            before, after = tls[b], tls[a]
            rel = f"{PLOTS_DIR}/{_safe(s)}--before-after" + (f"--{_safe(a)}" if len(pairs) > 1 else "") + ".png"
            titles = (outcome_words(before), outcome_words(after))
            jobs.append(("before_after", rel, dict(before=before.timeline, after=after.timeline, titles=titles,
                                                   bucket_s=bucket)))
            out.append(rel)
        for r in tls.values():
            rel = f"{PLOTS_DIR}/{_safe(s)}--{_safe(r.target)}.png"
            jobs.append(("timeline", rel, dict(tl=r.timeline, subtitle=_subtitle(r), bucket_s=bucket, ylim=ylim)))
            out.append(rel)
            if r.gauges is not None:  # the family's node gauges, on the timeline's time axis
                rel = f"{PLOTS_DIR}/{_safe(s)}--{_safe(r.target)}{GAUGES_SUFFIX}"
                jobs.append(("gauges", rel, dict(g=r.gauges, subtitle=_subtitle(r),
                                                 xmax=max(r.timeline.end, bucket))))
                out.append(rel)
    bench_rels: list[str] = []
    for i, view in enumerate(run.bench_views()):
        fam = view.bench_about.get("family") or str(i)
        rel = f"{PLOTS_DIR}/normal-path-cdf.png" if i == 0 else f"{PLOTS_DIR}/normal-path-cdf-{fam}.png"
        order, baseline = S.bench_order(view)
        command, op = view.bench_words()
        jobs.append(("bench", rel, dict(samples={t: view.bench[t] for t in order}, baseline=baseline,
                                        command=command, op=op)))
        bench_rels.append(rel)
    return jobs, rels, bench_rels


def render(job: tuple, root: str) -> str:
    kind, rel, kw = job
    fn = {"timeline": P.timeline_png, "before_after": P.before_after_png, "bench": P.bench_cdf_png,
          "gauges": GP.gauges_png}[kind]
    fn(path=Path(root) / rel, **kw)
    return rel


def _render_all(jobs: list[tuple], root: Path, n_jobs: int, timeout_s: float = 600.0) -> None:
    """Render every job; with ``n_jobs`` > 1, slices go to worker processes.

    Workers are plain ``python -m reports.build --render JOBFILE`` subprocesses fed a pickled job
    slice, not a multiprocessing pool: no fork of a runner that has threads, no re-import of the
    caller's __main__ (spawn/forkserver do that), and a hard timeout. A worker that fails or times
    out has its slice rendered here instead, so a report never loses a plot to the pool.
    """
    if n_jobs <= 1 or len(jobs) < 6:
        for job in jobs:
            render(job, str(root))
        return
    import pickle
    import subprocess
    import sys
    import tempfile

    slices = [jobs[k::n_jobs] for k in range(n_jobs)]
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parent.parent)  # the children import this very code
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MPLBACKEND", "Agg")
    procs: list[tuple[list[tuple], subprocess.Popen, str]] = []
    tmp = tempfile.mkdtemp(prefix="pdc-render-")
    try:
        for k, sl in enumerate(slices[1:], start=1):
            jf = os.path.join(tmp, f"jobs{k}.pickle")
            with open(jf, "wb") as fh:
                pickle.dump((str(root), sl), fh, protocol=pickle.HIGHEST_PROTOCOL)
            p = subprocess.Popen([sys.executable, "-m", "reports.build", "--render", jf], env=env,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 start_new_session=True)
            procs.append((sl, p, jf))
        for job in slices[0]:
            render(job, str(root))
        for sl, p, _ in procs:
            err = b""
            try:
                _, err = p.communicate(timeout=timeout_s)
                ok = p.returncode == 0
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
                ok = False
            if not ok:
                last = (err or b"").decode("utf-8", "replace").strip().splitlines()[-1:]
                log.warning("plot worker pid %d failed (exit %s%s); rendering its %d plot(s) here", p.pid,
                            p.returncode, f": {last[0][:200]}" if last else "", len(sl))
                for job in sl:
                    render(job, str(root))
    finally:
        for _, p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)


def default_jobs() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 4))


def generate(run_dir: str | Path, *, bench: str | Path | None = None, jobs: int | None = None) -> list[Path]:
    root = Path(run_dir)
    run = load_run(root, bench=bench)
    plot_jobs, rels, bench_rels = plan(run)
    plots_dir = root / PLOTS_DIR
    wanted = {root / rel for _, rel, _ in plot_jobs}
    if plots_dir.is_dir():  # stale plots of an earlier generation would mislead
        for old in plots_dir.glob("*.png"):
            if old not in wanted:
                old.unlink()
    _render_all(plot_jobs, root, default_jobs() if jobs is None else jobs)
    written = sorted(wanted)
    for name, text in (("summary.md", S.summary_md(run, rels, bench_rels)),
                       ("report.html", report_html(run, rels, bench_rels)),
                       ("bench.json", S.bench_json(run))):
        path = root / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _worker_main(argv: list[str]) -> int:
    """``python -m reports.build --render JOBFILE``: render a pickled job slice (written by
    ``_render_all`` of this same code, in a private temp dir)."""
    import pickle

    if len(argv) != 2 or argv[0] != "--render":
        raise SystemExit("usage: python -m reports.build --render JOBFILE")
    with open(argv[1], "rb") as fh:
        root, jobs = pickle.load(fh)
    for job in jobs:
        render(job, root)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_worker_main(sys.argv[1:]))

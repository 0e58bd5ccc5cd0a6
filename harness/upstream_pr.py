"""PR bodies for the upstream diffs (``pdchaos upstream check --pr-bodies``): each proven diff's body, in
its project's pull-request template (the section headings an :class:`harness.upstream.UpstreamProject`
names in ``pr_sections``), written from the diff's header and from what this run of the check measured
(its named tests before and after it, its gates), as ``NN-slug.pr.md`` beside the diff.

The filling is plain: each template section names what goes in it (``what``: subject, defect, related;
``change``: what the diff changes and its settings; ``tests``: how to run the tests and what the check saw;
``details``: Depends and notes), and nothing of this project's own vocabulary is added.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .upstream import DiffResult, TEST_ID


def _files(diff: Any, package: str) -> str:
    pkg = [f.path for f in diff.package_files(package)]
    tests = [f.path + (" (new)" if f.new_file else "") for f in diff.test_files()]
    other = [f.path for f in diff.other_files(package)]
    return "\n".join(f"- `{p}`" for p in [*pkg, *tests, *other])


def _tests(p: Any, diff: Any, r: DiffResult) -> str:
    named = [t for t in dict.fromkeys(TEST_ID.findall(diff.header.get("Tests", "")))
             if t.split("::", 1)[0] in {f.path for f in diff.test_files()}]
    files = sorted({t.split("::", 1)[0] for t in named})
    lines = ["```bash", f"pytest -v {' '.join(files)}", "```", ""]
    b, a = r.before, r.after
    if b is not None and a is not None:
        base = ("the pinned release" if r.base == "Depends: none" else
                f"the pinned release with {r.base[len('Depends: '):]} applied" if r.base.startswith("Depends: ")
                else "the changes before it")
        lines.append(f"On {p.label}, without this change ({base}): {len(b.failed)} failed, {len(b.passed)} passed. "
                     f"With it: {len(a.passed)} passed, {len(a.failed)} failed, {len(a.skipped)} skipped.")
    for g in r.gates:
        if g.name == "ruff" and g.ok:
            lines.append(f"pre-commit's ruff ({g.detail.split(':', 1)[0]}): clean on every line this change touches.")
        if g.name == "tethering" and g.ok:
            lines.append("check-test-tethering: every new test file is run by a Buildkite job.")
    changed = diff.header.get("Tests-changed", "none")
    if changed.strip().lower() != "none":
        lines.append(f"Existing tests changed: {changed}")
    return "\n".join(lines)


def _strip_local(text: str) -> str:
    """Header prose as an upstream reader reads it: no pointer into this project's tree."""
    text = re.sub(r"\s*\([^()]*\b(?:pd-chaos|tests/connector_patch|connector_patch)\b[^()]*\)", "", text)
    return text.strip()


def pr_body(p: Any, diff: Any, r: DiffResult) -> str:
    h = diff.header
    notes = _strip_local(h.get("Notes", ""))
    keys = sorted(set(re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)*_(?:ms|s)\b", notes)))
    deps = diff.depends() or []
    fill = {
        "what": "\n\n".join(x for x in [
            f"**{_strip_local(h.get('Subject', ''))}**",
            _strip_local(h.get("Defect", "")),
            f"Related: {_strip_local(h['Related'])}" if h.get("Related") else ""] if x),
        "change": "Files:\n\n" + _files(diff, p.package),
        "tests": _tests(p, diff, r),
        "details": "\n\n".join(x for x in [
            (f"Applies on its own on {p.label}." if not deps
             else f"Applies on {p.label} after: " + ", ".join(f"{n:02d}" for n in deps) + "."), notes] if x),
        "user-facing": (f"New `kv_connector_extra_config` setting(s): {', '.join(f'`{k}`' for k in keys)} "
                        "(see above for defaults)." if keys else "No."),
    }
    parts = []
    for heading, wanted in p.pr_sections:
        parts += [heading, "", "\n\n".join(fill[k].strip() for k in wanted if fill.get(k, "").strip()) or "n/a", ""]
    if p.pr_footer:
        parts += [p.pr_footer, ""]
    return "\n".join(parts)


def write_pr_bodies(p: Any, results: list[DiffResult]) -> list[Path]:
    """``NN-slug.pr.md`` beside each proven diff of ``results``; returns the files written."""
    by_name = {d.name: d for d in p.series()}
    written = []
    for r in results:
        d = by_name.get(r.name)
        if d is None or not r.ok or not p.pr_sections:
            continue
        out = d.path.with_name(d.path.name[: -len(".diff")] + ".pr.md")
        out.write_text(pr_body(p, d, r), encoding="utf-8")
        written.append(out)
    return written

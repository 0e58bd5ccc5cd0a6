"""Verdicts and expectations: what a run's check results amount to, and whether that is what the
scenario claims.

A **verdict** is derived from the check results of one run:

``error``  the run cannot be judged: ``harness_integrity``, ``workload_ran``, ``fault_effect`` or
           ``triggers`` failed (a fault that never started or did nothing, an event the claim rests
           on that never happened, a probe lost, a workload that crashed), or a checker raised. It never
           matches an expectation, is counted apart, and makes the exit 1.
``stall``  ``no_stall`` failed (some op never returned);
``fail``   any other check failed;
``pass``   every check that ran held.

An **expectation** is a claim per target: the verdict *and the exact set of checks that fail*
(``{verdict: fail, failing: [no_busy_wait]}``; a bare ``pass`` is the empty set), plus, where
measurement showed a check to go either way, the checks that ``may_fail``. A run matches when its
verdict equals one alternative's and its failing set holds every ``failing`` check and nothing
beyond ``failing`` and ``may_fail``; anything else is a deviation that names the difference. So an
expected ``fail`` is met only by the failure it claims, not by any failure.

Expectations travel as text (the journal's meta line, summary.json): alternatives joined by ``|``,
each ``verdict`` or ``verdict[check,check]``, e.g. ``fail[no_busy_wait]`` or
``fail[fail_fast]|stall[bounded_return,no_stall]``. A verdict without brackets names no set: that
is how journals written before expectations named their checks read, and it matches any failing
set of that verdict (an old run re-checked offline is judged as it was).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

VERDICTS = ("pass", "fail", "stall")
# checks that judge the run itself, not the system: when one fails, nothing else can be trusted
ERROR_CHECKS = ("harness_integrity", "workload_ran", "fault_effect", "triggers")
RAISED = "checker error: "  # the message prefix of a check that raised (harness/checks.py run_checks)
# the message prefix of a check that could not judge (the history lacks what it needs): the run is
# an error, so "cannot tell" never meets an expectation that names the check as failing
UNDECIDED = "cannot judge: "


class Alternative(NamedTuple):
    verdict: str
    failing: frozenset[str] | None  # None: any failing set (an expectation saved before sets were named)
    may: frozenset[str] = frozenset()  # checks that may fail or hold (measured to vary), written ``name?``

    def text(self) -> str:
        if self.failing is None:
            return self.verdict
        names = sorted(self.failing) + [f"{n}?" for n in sorted(self.may)]
        return f"{self.verdict}[{','.join(names)}]" if names else self.verdict

    def matches(self, verdict: str, got: frozenset[str]) -> bool:
        if self.verdict != verdict:
            return False
        return self.failing is None or (self.failing <= got <= self.failing | self.may)


def parse(text: str | None) -> list[Alternative]:
    """``fail[a,b,c?]|stall[no_stall]`` -> alternatives. Empty text means ``pass``."""
    out = []
    for part in str(text or "pass").split("|"):
        part = part.strip()
        if not part:
            continue
        if "[" in part and part.endswith("]"):
            v, names = part[:-1].split("[", 1)
            names_l = [n.strip() for n in names.split(",") if n.strip()]
            out.append(Alternative(v.strip(), frozenset(n for n in names_l if not n.endswith("?")),
                                   frozenset(n[:-1] for n in names_l if n.endswith("?"))))
        else:
            out.append(Alternative(part, frozenset() if part == "pass" else None))
    return out or [Alternative("pass", frozenset())]


def overlap(a: str | None, b: str | None) -> bool:
    """Whether one run could meet both expectations: some alternative of each admits the same
    verdict and failing set (``pass`` and ``pass|fail[no_leaks]`` overlap; ``pass`` and
    ``fail[no_stall]`` do not). An old-style set (``fail``) admits every set of its verdict."""
    for x in parse(a):
        for y in parse(b):
            if x.verdict != y.verdict:
                continue
            if x.failing is None or y.failing is None:
                return True
            need = x.failing | y.failing  # the smallest set both could see...
            if need <= (x.failing | x.may) and need <= (y.failing | y.may):  # ...allowed by both
                return True
    return False


def text(alternatives: Iterable[Alternative]) -> str:
    return "|".join(a.text() for a in alternatives)


def words(expected: str | None) -> str:
    """For people: ``fail (failing: no_busy_wait) or stall (failing: no_stall)``."""
    out = []
    for a in parse(expected):
        may = f"; may fail: {', '.join(sorted(a.may))}" if a.may else ""
        out.append(f"{a.verdict} (failing: {', '.join(sorted(a.failing))}{may})" if a.failing else a.verdict)
    return " or ".join(out)


def of_results(results: Iterable) -> tuple[str, list[str]]:
    """(verdict, sorted names of the failed checks) from check results (objects with ``name``,
    ``ok``, ``message``, or dicts with those keys)."""
    rows = [r if isinstance(r, dict) else {"name": r.name, "ok": r.ok, "message": r.message} for r in results]
    failing = sorted({r["name"] for r in rows if r.get("ok") is False})
    if any(r["name"] in ERROR_CHECKS and r.get("ok") is False for r in rows) or any(
            r.get("ok") is False and str(r.get("message", "")).startswith((RAISED, UNDECIDED)) for r in rows):
        return "error", failing
    if "no_stall" in failing:
        return "stall", failing
    return ("fail" if failing else "pass"), failing


def outcome(verdict: str, expected: str | None, failing: Iterable[str] | None = None) -> str:
    """``as_expected`` / ``deviation``, or the verdict itself for ``skipped`` and ``error``."""
    if verdict in ("skipped", "error"):
        return verdict
    got = frozenset(failing or ())
    return "as_expected" if any(a.matches(verdict, got) for a in parse(expected)) else "deviation"


def difference(verdict: str, expected: str | None, failing: Iterable[str] | None) -> str:
    """Why a run deviates, naming the checks: ``failing {a, c}; expected fail[a,b]: c failed
    unexpectedly, b did not fail``."""
    got = frozenset(failing or ())
    alts = parse(expected)
    near = min(alts, key=lambda a: len(((a.failing if a.failing is not None else got) ^ got) - a.may)
               + (a.verdict != verdict))
    want = near.failing if near.failing is not None else got
    extra, missing = sorted(got - want - near.may), sorted(want - got)
    parts = []
    if extra:
        parts.append(f"{', '.join(extra)} failed unexpectedly")
    if missing:
        parts.append(f"{', '.join(missing)} did not fail")
    if not parts and near.verdict != verdict:
        parts.append(f"verdict {verdict}, not {near.verdict}")
    return (f"verdict {verdict} failing [{', '.join(sorted(got))}], expected {text(alts)}: "
            + "; ".join(parts))

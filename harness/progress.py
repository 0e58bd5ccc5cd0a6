"""Progress: a live rich display on a terminal, plain lines in CI (or with --plain)."""

from __future__ import annotations

from pathlib import Path

from .outputs import counts, tally

MARK = {"as_expected": "as expected", "deviation": "DEVIATION", "skipped": "SKIPPED", "error": "ERROR"}
STYLE = {"as_expected": "green", "deviation": "bold red", "skipped": "yellow", "error": "bold red"}


class Progress:
    def __init__(self, total: int, plain: bool):
        self.total = total
        self.plain = plain
        self.done = 0
        self._rich = None
        self._task = None

    def __enter__(self) -> "Progress":
        if not self.plain:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn())
            self._rich.__enter__()
            self._task = self._rich.add_task("scenarios", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(None, None, None)

    def start(self, scenario: str, target: str) -> None:
        if self._rich is not None:
            from rich.markup import escape

            self._rich.update(self._task, description=escape(f"{scenario} [{target}]"))

    def result(self, r) -> None:
        self.done += 1
        outcome = r.outcome
        line = (f"[{self.done}/{self.total}] {r.scenario} [{r.target}] {r.verdict} "
                f"(expected {r.expected}) {MARK[outcome]} {r.elapsed_s:.1f}s")
        if outcome != "as_expected" and r.reason:
            line += f" - {r.reason}"
        if self._rich is not None:
            self._rich.console.print(line, style=STYLE[outcome], markup=False, highlight=False)
            self._rich.advance(self._task)
        else:
            print(line, flush=True)

    def final(self, results, run_dir: Path, elapsed: float) -> None:
        """The counts per outcome, then one line per run that was not as expected (skips included)."""
        c = counts(r.outcome for r in results)
        print(f"{len(results)} scenario runs in {elapsed:.1f}s: {tally(c)}; run folder {run_dir}", flush=True)
        for r in results:
            outcome = r.outcome
            if outcome == "deviation":
                print(f"  DEVIATION {r.scenario} [{r.target}]: {r.verdict}, expected {r.expected}: {r.reason}",
                      flush=True)
            elif outcome in ("error", "skipped"):
                print(f"  {MARK[outcome]} {r.scenario} [{r.target}]: {r.reason}", flush=True)

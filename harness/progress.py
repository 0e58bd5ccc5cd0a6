"""Progress: a live rich display on a terminal, plain lines in CI (or with --plain)."""

from __future__ import annotations

from pathlib import Path


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
        mark = "as expected" if r.as_expected else "DEVIATION"
        line = (f"[{self.done}/{self.total}] {r.scenario} [{r.target}] {r.verdict} "
                f"(expected {r.expected}) {mark} {r.elapsed_s:.1f}s")
        if r.verdict in ("skipped", "error") or not r.as_expected:
            line += f" - {r.reason}" if r.reason else ""
        if self._rich is not None:
            style = "green" if r.as_expected else "bold red"
            self._rich.console.print(line, style=style, markup=False, highlight=False)
            self._rich.advance(self._task)
        else:
            print(line, flush=True)

    def final(self, results, run_dir: Path, elapsed: float) -> None:
        dev = [r for r in results if not r.as_expected]
        skipped = [r for r in results if r.verdict == "skipped"]
        print(f"{len(results)} scenario runs in {elapsed:.1f}s: {len(results) - len(dev) - len(skipped)} as expected, "
              f"{len(dev)} deviations, {len(skipped)} skipped; run folder {run_dir}", flush=True)
        for r in dev:
            print(f"  DEVIATION {r.scenario} [{r.target}]: {r.verdict}, expected {r.expected}: {r.reason}", flush=True)

"""pytest plugin: each scenario file and target is a test item.

``pytest scenarios/lookup`` collects every ``*.yaml`` under a ``scenarios`` folder (or any YAML
given with ``--pdchaos``), one item per target, e.g. ``slow-peer.yaml::slow-peer[legacy]``. An
item passes when the target ends with the verdict its scenario expects; a deviation fails with
the violated checks as the assertion message; a missing tool (toxiproxy-server, root) skips with
the reason. Journals go to ``runs/pytest-<id>/`` like any run. Use ``--junitxml`` for CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pdchaos")
    group.addoption("--pdchaos", action="store_true", help="collect any *.yaml given as pd-chaos scenarios")
    group.addoption("--pdchaos-runs-dir", default="runs", help="where scenario run folders go (default runs/)")
    group.addoption("--pdchaos-target", action="append", metavar="TARGET",
                    help="only this target (repeatable; targets come from each scenario's family: a scenario "
                         "without it contributes no item)")


def _collects_scenarios(args: list[str]) -> bool:
    """Whether this pytest call collects scenario items: ``--pdchaos``, or a path given under a
    ``scenarios`` folder (``pytest scenarios/lookup``)."""
    if "--pdchaos" in args:
        return True
    return any(not a.startswith("-") and "scenarios" in Path(a.split("::")[0]).parts for a in args)


def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """pyproject.toml's addopts run tests/ in two pytest-xdist workers (``-n 2``); scenario items
    run one after another, each with the machine to itself as in ``pdchaos run`` (two at once would
    change the timing their verdicts rest on, and each worker would start its own Toxiproxy, node
    pool and run folder): a call that collects scenarios gets ``-n 0``."""
    if _collects_scenarios(args) and early_config.pluginmanager.hasplugin("xdist"):
        args.extend(["-n", "0"])


def pytest_collect_file(parent: pytest.Collector, file_path: Path):
    if file_path.suffix not in (".yaml", ".yml"):
        return None
    if parent.config.getoption("--pdchaos") or "scenarios" in file_path.parts:
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFailure(Exception):
    pass


class ScenarioFile(pytest.File):
    def collect(self):
        from harness.errors import UsageError
        from harness.schema import load_scenario

        try:
            sc = load_scenario(self.path)
        except UsageError as exc:
            raise self.CollectError(str(exc)) from None
        only = self.config.getoption("--pdchaos-target")
        for target in sc.model.targets:
            if only and target not in only:
                continue
            item = ScenarioItem.from_parent(self, name=f"{sc.name}[{target}]", scenario=sc, target=target)
            item.add_marker(pytest.mark.timeout(sc.model.cap + 30))
            yield item


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario, target, **kwargs):
        super().__init__(**kwargs)
        self.scenario = scenario
        self.target = target

    def _runner(self):
        from harness.runner import Runner, new_run_dir

        stash = self.config.stash
        key = _RUNNER_KEY
        if key not in stash:
            from contextlib import ExitStack

            from harness.services import start_toxiproxy

            run_dir = new_run_dir(self.config.getoption("--pdchaos-runs-dir"))
            services = ExitStack()  # closed at the end of the session (stops toxiproxy-server)
            stash[_SERVICES_KEY] = services
            items = [i for i in self.session.items if isinstance(i, ScenarioItem)]
            toxiproxy = start_toxiproxy(list({id(i.scenario): i.scenario for i in items}.values()), services, run_dir)
            from harness.pool import NodePool

            pool = services.enter_context(NodePool(run_dir))  # warm nodes between scenario items
            stash[key] = (Runner(run_dir, toxiproxy=toxiproxy, services={"node_pool": pool}), run_dir)
        return stash[key]

    def runtest(self) -> None:
        runner, _ = self._runner()
        res = runner.run_one(self.scenario, self.target)
        runner.results.append(res)
        self.user_properties.append(("verdict", res.verdict))
        self.user_properties.append(("journal", str(runner.run_dir / res.dir / "journal.jsonl")))
        if res.outcome == "skipped":  # not run here: a pytest skip with the reason, never a pass
            pytest.skip(res.reason)
        if res.outcome != "as_expected":  # a deviation or a harness error
            failed = [c for c in res.checks if c["ok"] is False]
            lines = [f"{self.target}: verdict {res.verdict}, expected {res.expected}"]
            lines += [f"  {c['name']}: {c['message']}" for c in failed] or [f"  {res.reason}"]
            raise ScenarioFailure("\n".join(lines))

    def repr_failure(self, excinfo, style=None):  # noqa: ARG002
        if isinstance(excinfo.value, ScenarioFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"scenario {self.scenario.name} [{self.target}]"


_RUNNER_KEY = pytest.StashKey[tuple]()
_SERVICES_KEY = pytest.StashKey[object]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    stash = session.config.stash
    if _SERVICES_KEY in stash:
        stash[_SERVICES_KEY].close()
    if _RUNNER_KEY in stash:
        from harness.runner import write_summary

        runner, run_dir = stash[_RUNNER_KEY]
        write_summary(run_dir, runner.results, "", sum(r.elapsed_s for r in runner.results))

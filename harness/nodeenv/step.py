"""A ``pdchaos setup`` step that installs one node env (the step interface of harness/setup.py):
present when the env's last step is stamped, each env step listed for ``pdchaos doctor``, a plan
for ``--dry-run``, and a failure that says how to resume. A node stack's step subclasses it."""

from __future__ import annotations

from typing import Any

from ..setup import StepFailed
from .venv import NodeEnv, NodeEnvError


class EnvStep:
    name = ""
    size = ""  # what the plan says it costs, e.g. "~6.6 GB, 2-5 min with a warm pip cache"

    def env(self) -> NodeEnv:
        raise NotImplementedError

    def lock_spec(self) -> Any:
        """The env's :class:`~harness.nodeenv.lock.LockSpec` (``pdchaos lock`` resolves it), or None
        when the env installs from no lock."""
        return None

    def present(self, env: NodeEnv) -> str | None:
        """What is installed (for ``already present``), or None when something is missing."""
        return f"{env.path}" if env.installed() else None

    def check(self) -> str | None:
        return self.present(self.env())

    def extra_pieces(self) -> list[tuple[str, bool, str]]:
        """What the env needs beyond its own steps (a system library), for ``pdchaos doctor``."""
        return []

    def pieces(self) -> list[tuple[str, bool, str]]:
        """For ``pdchaos doctor``: each install step of the node env (done or not, with its pin)."""
        env = self.env()
        pending = set(env.pending())
        return [(f"{self.name}/{s.name}", s.name not in pending, f"{s.key} in {env.path}")
                for s in env.steps] + self.extra_pieces()

    def plan(self) -> str:
        env = self.env()
        return (f"{'resume' if env.path.exists() else 'create'} venv {env.path} ({self.size}); "
                f"steps: {', '.join(env.pending())}")

    def install(self) -> Any:
        env = self.env()
        try:
            return env.ensure()
        except NodeEnvError as exc:
            raise StepFailed(str(exc), f"rerun `pdchaos setup --only {self.name}` (it resumes where it stopped); "
                                       f"full output in {env.log}") from None

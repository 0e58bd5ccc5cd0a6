"""The tiny model the P/D nodes serve: a random-weight Llama and a byte-level BPE tokenizer, built
locally with the node env's python (no hub, ever), under
``${XDG_CACHE_HOME:-~/.cache}/pdchaos/models/tiny-llama-v1/``.

Shape: hidden 128, 4 heads, 2 KV heads, head size 32 (vLLM's CPU attention needs >= 32), 2 layers,
vocab 512, bfloat16, 512 positions. The weights come from a seeded torch RNG and the tokenizer is
trained on a corpus generated from a seeded RNG, so every machine gets the same model. The build
(``build_tiny_model.py``) writes into a temporary folder that is renamed into place only when
complete, with a stamp holding the build parameters; a second call reads the stamp and returns.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from harness.nodeenv.venv import NodeEnvError, cache_root, run_logged

MODEL_NAME = "tiny-llama-v1"
STAMP = "pdchaos-build.json"
BUILD_SCRIPT = Path(__file__).with_name("build_tiny_model.py")
BUILD_TIMEOUT_S = 600.0

PARAMS = {
    "architecture": "LlamaForCausalLM",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "dtype": "bfloat16",
    "initializer_range": 0.02,
    "seed": 20240601,
    "corpus_lines": 4000,
    "bos_token": "<|bos|>",
    "eos_token": "<|eos|>",
    "pad_token": "<|pad|>",
}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}


def model_dir() -> Path:
    return cache_root() / "models" / MODEL_NAME


def wanted_stamp() -> dict:
    """What identifies a build: the parameters and the build script itself."""
    return {"model": MODEL_NAME, "params": PARAMS,
            "script_sha256": hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest()}


def read_stamp(path: Path | None = None) -> dict | None:
    try:
        return json.loads(((path or model_dir()) / STAMP).read_text())
    except (OSError, ValueError):
        return None


def model_built(path: Path | None = None) -> bool:
    """The model folder holds a complete build of these parameters. Fast, no subprocess."""
    path = path or model_dir()
    stamp = read_stamp(path)
    if stamp is None:
        return False
    want = wanted_stamp()
    if any(stamp.get(k) != want[k] for k in want):
        return False
    return all((path / f).is_file() for f in stamp.get("files", {})) and bool(stamp.get("files"))


def build_model(python: Path | None = None, out=print) -> str:
    """Build (or rebuild after a parameter change) with the node env's python; one line back.
    NodeEnvError (one line) when it cannot."""
    target = model_dir()
    if model_built(target):
        return f"already built at {target}"
    if python is None:
        from .recipe import pd_node_env

        env = pd_node_env()
        if not env.installed():
            raise NodeEnvError("the P/D node stack is not installed, and the model is built with its python "
                               "(transformers, tokenizers): run `pdchaos setup --only pd-node-stack` first")
        python = env.python
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{MODEL_NAME}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log = target.parent / f"{MODEL_NAME}.build.log"
    log.write_text("")
    t0 = time.monotonic()
    out(f"  {MODEL_NAME}: building with {python} (log {log}) ...")
    try:
        text = run_logged([str(python), str(BUILD_SCRIPT), json.dumps(PARAMS), str(tmp)], BUILD_TIMEOUT_S,
                          log, f"build {MODEL_NAME}", env=_offline_env(), cwd=str(target.parent))
        try:
            result = json.loads(text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise NodeEnvError(f"build {MODEL_NAME}: the build printed no result line (see {log})") from None
        (tmp / STAMP).write_text(json.dumps({**wanted_stamp(), **result, "built_at": time.time()}, indent=1) + "\n")
        shutil.rmtree(target, ignore_errors=True)  # an older or half-done build
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f"built {MODEL_NAME} at {target} in {time.monotonic() - t0:.0f} s"


def _offline_env() -> dict[str, str]:
    from harness.nodeenv.venv import child_env

    return child_env({**OFFLINE_ENV, "PYTHONNOUSERSITE": "1"})

"""Node stacks: the pinned environments real nodes run in, kept apart from the harness's own.

A stack is a recipe (``recipe.py``: a venv under ``~/.cache/pdchaos/envs/`` built step by step,
stamped when complete, never installed twice), its ``pdchaos setup`` steps (``setup_steps()``), and the
plugin or stubs it installs from source. A family names the stacks its nodes need
(``Family.setup_steps()``); two families may share one (lookup's ascend-cpu target and layerwise
both run vllm-ascend's code in ``ascend_cpu``). The venv mechanics are the core's
(harness/nodeenv/); the core knows no stack: each family names the ones it needs.

- ``vllm_cpu``: vLLM's CPU build, torch and Mooncake's TransferEngine, the CPU shim, and the tiny
  model built locally (the pd family's real P/D nodes).
- ``ascend_cpu``: vLLM 0.23.0 and vllm-ascend 0.23.0.post1 on CPU with the NPU stubs (the one
  place anything is stubbed), the conformance env.
"""

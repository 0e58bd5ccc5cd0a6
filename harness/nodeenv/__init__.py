"""Node environments: the venv mechanics node stacks are built with (stacks/ holds the recipes).

* :mod:`.venv` — a generic pinned venv under ``${XDG_CACHE_HOME:-~/.cache}/pdchaos/envs/``,
  installed step by step and stamped when complete (idempotent, resumable).
* :mod:`.lock` — lock files with hashes: resolved by ``pdchaos lock`` (uv), installed by uv with
  nothing resolved at set-up.
* :mod:`.pip` — a local package installed from a clean copy, the final import check.
* :mod:`.exec_node` — runs a node's own module with a node env's python.
"""

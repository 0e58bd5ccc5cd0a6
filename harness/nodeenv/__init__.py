"""Node environments: the venv mechanics node stacks are built with (stacks/ holds the recipes).

* :mod:`.venv` — a generic pinned venv under ``${XDG_CACHE_HOME:-~/.cache}/pdchaos/envs/``,
  installed step by step and stamped when complete (idempotent, resumable).
* :mod:`.pip` — what a recipe installs with: requirements from a wheel's METADATA, local wheel
  folders, a local package from a clean copy, the final import check.
* :mod:`.exec_node` — runs a node's own module with a node env's python.
"""

"""pd-chaos's neutral core: the Family interface and loader, scenario schema, checks, verdicts,
runner, plan, topology, node pool, setup, node-env mechanics, CI helpers, CLI, pytest plugin.
It names no family (tests/harness/test_layering.py)."""

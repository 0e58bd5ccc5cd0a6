"""pd-chaos harness: CLI, scenario schema, runner, topology, workload, checks, pytest plugin."""

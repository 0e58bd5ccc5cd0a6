"""The ground floor: what every node process stands on, inside the harness's environment and
inside the node envs alike. It imports nothing of this project (tests/harness/test_layering.py).

- ``journal``: the run's history, one JSON line per record, written by every node.
- ``nodeio``: a node's life (endpoint checks, bind, READY, signals, the runner's death, exit codes).
- ``control``: the control channel a node answers (process stats, fault switches).
- ``workload``: what every workload node shares (start signal, horizon, tally, its ending).
"""

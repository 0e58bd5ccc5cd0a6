"""One rank of the abort-drain agreement over real torch.distributed Gloo (run twice, by
tests/connector_patch/test_pd_pure.py, with the P/D node env's python: torch lives there, not in the harness's env).

argv: RANK PORT REPO. Prints one JSON line: the requests released in each round.
"""

import json
import sys

import torch
import torch.distributed as dist

rank, port, repo = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, repo)
from connector_patch.pd.drain import AbortDrain  # noqa: E402

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)


def allreduce_min(flags):
    t = torch.tensor(flags, dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return [int(x) for x in t.tolist()]


d = AbortDrain(allreduce_min)
for rid in ("r1", "r2", "r3"):
    d.abort(rid)
# rank 0 still sends r1; rank 1 still sends r2; r3 is drained on both
d.transfer_started("r1" if rank == 0 else "r2")
rounds = [d.agree(["r1", "r2", "r3"])]
d.transfer_done("r1" if rank == 0 else "r2")  # rank 0 drained r1; rank 1 drained r2
rounds.append(d.agree(["r1", "r2"]))
rounds.append(d.agree([]))  # nothing left: no collective needed, nothing released
print(json.dumps({"rank": rank, "rounds": rounds, "left": d.aborted()}), flush=True)
dist.destroy_process_group()

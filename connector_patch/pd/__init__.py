"""The pure logic of the hardened Mooncake P/D connector (Step 7, in progress).

Nothing here imports vLLM, torch or zmq: the modules are the rules a hardened connector applies,
tested on their own, and the thin vLLM subclass (not written yet) calls them.

- :mod:`.ledger`: D's KV loads with a deadline each, outcomes from any thread, reported once in
  vLLM's contract (``finished_recving`` + blocks with load errors).
- :mod:`.terminal`: P's bounded, expiring records of requests it will never send (aborted or
  failed), so a late pull gets an answer at once.
- :mod:`.drain`: P's abort drain: an aborted request is released once no transfer of it is in
  flight on any TP rank (a MIN all-reduce, injected).
"""

"""The pure logic of the hardened Mooncake P/D connector (Step 7).

Nothing here imports vLLM, torch or zmq: the modules are the rules the hardened connector applies,
tested on their own. The vLLM subclass that calls them is
:class:`connector_patch.pd.vllm_connector.HardenedMooncakeConnector` (``connector_patch/pd/vllm_connector.py``).

- :mod:`.ledger`: D's KV loads with a deadline each, outcomes from any thread, reported once in
  vLLM's contract (``finished_recving`` + blocks with load errors).
- :mod:`.settle`: D's settlements: a failed or aborted load frees its blocks only once P can no
  longer write into them.
- :mod:`.pull`: which requests of one pull D cancels at P (all of a failed pull, only the aborted
  ones otherwise).
- :mod:`.write`: P's write in chunks, each asked first whether the pull's connection dropped or P
  shuts down (issue 43, 7a).
- :mod:`.settings`: the connector's settings (``kv_connector_extra_config``), the check of
  ``kv_transfer_params``, the idle sleep and the rate-limited failure log.
- :mod:`.terminal`: P's bounded, expiring records of requests it will never send (aborted,
  cancelled or expired), so a late pull gets an answer at once.
- :mod:`.drain`: P's abort drain: an aborted request is released once no transfer of it is in
  flight on any TP rank (a MIN all-reduce, injected). Not used by the subclass: with vLLM 0.32,
  vLLM's ``KVOutputAggregator`` already frees a request only once every rank reported it.
"""

"""One mutant per guarantee: the hardened connector (connector_patch/pd/vllm_connector.py) with that
guarantee switched off and nothing else changed. A mutant swaps the class of the scheduler or
worker side the hardened connector built (the subclasses add no state) and, where the guarantee
is a setting, changes it on the built object. Runs inside a vLLM node only."""

from __future__ import annotations

import dataclasses

import zmq
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as mc

from connector_patch.pd import vllm_connector as hm
from connector_patch.pd.ledger import LoadLedger

HS, HW = hm.HardenedMooncakeConnectorScheduler, hm.HardenedMooncakeConnectorWorker
FOREVER_MS = 10 ** 9  # ~11.6 days: no deadline a run can reach (the setting has no "off")


class _Mutant(hm.HardenedMooncakeConnector):
    SCHEDULER: type | None = None
    WORKER: type | None = None

    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        if self.connector_scheduler is not None:
            if self.SCHEDULER is not None:
                self.connector_scheduler.__class__ = self.SCHEDULER
            self.mutate_scheduler(self.connector_scheduler)
        if self.connector_worker is not None:
            if self.WORKER is not None:
                self.connector_worker.__class__ = self.WORKER
            self.mutate_worker(self.connector_worker)

    def mutate_scheduler(self, s) -> None:  # noqa: ANN001
        pass

    def mutate_worker(self, w) -> None:  # noqa: ANN001
        pass


# 1. every KV load on D ends within kv_load_timeout_ms
class HardenedMooncakeConnectorMutantNoLoadDeadline(_Mutant):
    def mutate_worker(self, w) -> None:  # noqa: ANN001
        w.settings = dataclasses.replace(w.settings, kv_load_timeout_ms=FOREVER_MS)
        w.ledger = LoadLedger(FOREVER_MS)


# 1. a FINISH that leaves an asked request unnamed fails it
class _TrustFinishWorker(HW):
    def _on_reply(self, raw, req_ids, named, pull_metas, addr=""):  # noqa: ANN001
        try:
            resp = self._xfer_resp_decoder.decode(raw)
            this = set(resp.ok_reqs or ()) | set(resp.err_reqs or ())
        except Exception:  # noqa: BLE001 - the hardened rule answers an undecodable reply
            return super()._on_reply(raw, req_ids, named, pull_metas, addr)
        # as if only the requests P named had been asked: an unnamed one waits (upstream)
        return super()._on_reply(raw, set(req_ids) & (named | this), named, pull_metas, addr)


class HardenedMooncakeConnectorMutantTrustFinish(_Mutant):
    WORKER = _TrustFinishWorker


# 1. unusable kv_transfer_params: D computes the prompt itself
class _NoParamsCheckScheduler(HS):
    def get_num_new_matched_tokens(self, request, num_computed_tokens):  # noqa: ANN001
        return mc.MooncakeConnectorScheduler.get_num_new_matched_tokens(self, request, num_computed_tokens)


class HardenedMooncakeConnectorMutantNoParamsCheck(_Mutant):
    SCHEDULER = _NoParamsCheckScheduler


# 2. dead peers found fast: the socket monitor of each pull
class HardenedMooncakeConnectorMutantNoPeerMonitor(_Mutant):
    def mutate_worker(self, w) -> None:  # noqa: ANN001
        hm._MON_EVENTS = zmq.EVENT_CONNECTED  # the monitor never hears of a refusal or a disconnect


# 3. after a peer failure D marks P's cached side-channel addresses stale
class _NoForgetPeerWorker(HW):
    def _forget_peer(self, engine_id: str) -> None:
        pass


class HardenedMooncakeConnectorMutantNoForgetPeer(_Mutant):
    WORKER = _NoForgetPeerWorker


# 6. listeners always answer; threads survive (upstream's listener: a bad frame count ends it)
class _ListenerDiesWorker(HW):
    _mooncake_sender_listener = mc.MooncakeConnectorWorker._mooncake_sender_listener


class HardenedMooncakeConnectorMutantListenerDies(_Mutant):
    WORKER = _ListenerDiesWorker


# 4. P answers a pending or late pull of a request it will never send, at once
class _Forgetful:
    """Terminal records that keep nothing: P no longer knows what it will never send."""

    def record(self, *_a, **_k) -> None:
        pass

    def lookup(self, *_a, **_k) -> None:
        return None

    def __len__(self) -> int:
        return 0


class HardenedMooncakeConnectorMutantNoLateAnswer(_Mutant):
    def mutate_worker(self, w) -> None:  # noqa: ANN001
        w.terminal = _Forgetful()


# found: P keeps the prompt's KV for D also when its one token is EOS
class _EosFreesScheduler(HS):
    def _p_request_finished(self, request, block_ids):  # noqa: ANN001
        return mc.MooncakeConnectorScheduler.request_finished(self, request, block_ids)


class HardenedMooncakeConnectorMutantEosFrees(_Mutant):
    SCHEDULER = _EosFreesScheduler


# 2. no busy wait: quiet waiting (connector_patch/quiet) undone in this process
class HardenedMooncakeConnectorMutantLoudWait(_Mutant):
    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        from connector_patch import quiet

        quiet.uninstall()


# 2. no busy wait, P's write: a write waiting on a D that takes no bytes sleeps (write.submit_and_wait)
class _SyncWriteWorker(HW):
    def _write_chunk(self, remote_session, c_src, c_dst, c_len) -> int:  # noqa: ANN001
        return self.engine.batch_transfer_sync_write(remote_session, c_src, c_dst, c_len)  # spins while it waits


class HardenedMooncakeConnectorMutantSyncWrite(_Mutant):
    WORKER = _SyncWriteWorker

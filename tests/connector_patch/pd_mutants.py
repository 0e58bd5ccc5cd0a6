"""Rule mutants for the P/D model (tests/connector_patch/pd_model.py), in one place: each breaks ONE
rule of the hardened connector (connector_patch/pd) the way a plausible edit or an old defect
would, as a monkeypatch of the real function or method. test_pd_model.py asserts the model
catches each (an invariant fails within its bounded examples) at every TP size listed.

A mutant is (name, what it breaks, the TP sizes it applies to, install(mod, patch)); ``mod`` is
the model's private copy of vllm_connector.py (pd_sim.hardened_module()), ``patch`` is
pytest's monkeypatch.setattr.
"""

from __future__ import annotations

from connector_patch.pd.ledger import LoadLedger
from connector_patch.pd.pull import PeerWatch, RequesterLinks
from connector_patch.pd.settle import Settlements
from connector_patch.pd.terminal import TerminalRecords
from connector_patch.pd.write import WriteGuard


def _gone_on_refusals_alone(mod, patch) -> None:
    """PeerWatch.gone: refusals alone read a pull that had connected as P gone (no 1.5 s of loss):
    a link that starts refusing frees D's blocks before P's keepalive sees the reset."""
    patch(PeerWatch, "gone", lambda self, now: self.refused >= self.refused_limit)


def _gone_after_loss_alone(mod, patch) -> None:
    """PeerWatch.gone: a connection lost for the heartbeat timeout reads as P gone, refusals or not
    (a blackholed P is alive and writes when the link heals)."""
    def gone(self, now):
        if not self.ever_connected:
            return self.refused >= self.refused_limit
        return self.lost_at is not None and now - self.lost_at >= self.after_loss_s
    patch(PeerWatch, "gone", gone)


def _requester_never_checked(mod, patch) -> None:
    """RequesterLinks.lost: P writes for a pull whose connection dropped (issue 30, item 4)."""
    patch(RequesterLinks, "lost", lambda self, tag: False)


def _complete_on_the_first_ok(mod, patch) -> None:
    """receive_kv's pull count: a load pulled from several P ranks completes on the first rank's OK."""
    orig = mod.HardenedMooncakeConnectorWorker.receive_kv

    def receive_kv(self, remote_engine_id, pull_metas):
        orig(self, remote_engine_id, pull_metas)
        for meta in pull_metas.values():
            meta.pull_tasks_count = min(meta.pull_tasks_count, 1)
    patch(mod.HardenedMooncakeConnectorWorker, "receive_kv", receive_kv)


def _free_before_settled(mod, patch) -> None:
    """Settlements.want: a failed or aborted load's blocks are released at once, whether P may
    still write into them or not."""
    def want(self, req_id, action, now=None):
        with self._lock:
            self._want.pop(req_id, None)
            self._closed[req_id] = 0.0
        return True
    patch(Settlements, "want", want)


def _not_opened_means_settled(mod, patch) -> None:
    """Settlements.opened: a load given up while its bootstrap query was out opens all the same
    (issue 30, item 1): its pull names blocks D gave away."""
    def opened(self, req_id, pulls):
        with self._lock:
            self._open.setdefault(req_id, set()).update(pulls)
            return True
    patch(Settlements, "opened", opened)


def _cancel_every_open_id(mod, patch) -> None:
    """cancel_targets: one abort cancels every open request of its pull (issue 30, item 2)."""
    def cancel_targets(req_ids, pull_failed, cancel_wanted):
        ids = set(req_ids)
        return ids if pull_failed or ids & set(cancel_wanted) else set()
    patch(mod, "cancel_targets", cancel_targets)


def _ack_while_writing(mod, patch) -> None:
    """_on_cancel: a transfer being written is acknowledged as cancelled (its ``sending`` guard
    gone): D frees the blocks while P's write runs on."""
    orig = mod.HardenedMooncakeConnectorWorker._on_cancel

    def on_cancel(self, payload):
        saved = {t: m.sending for t, m in self.reqs_need_send.items()}
        for m in self.reqs_need_send.values():
            m.sending = 0
        try:
            return orig(self, payload)
        finally:
            for t, n in saved.items():
                if t in self.reqs_need_send:
                    self.reqs_need_send[t].sending = n
    patch(mod.HardenedMooncakeConnectorWorker, "_on_cancel", on_cancel)


def _late_pull_served(mod, patch) -> None:
    """TerminalRecords.lookup: P forgets what it will never send; a pull that comes after P
    acknowledged its cancel (a cancel round overtakes the pull) is served (seed 003)."""
    patch(TerminalRecords, "lookup", lambda self, transfer_id, now: None)


def _cancelled_meta_written(mod, patch) -> None:
    """_build_transfer_params: a transfer cancelled or aborted while its pull waited is written
    all the same (its ``pdchaos_aborted`` mark ignored)."""
    orig = mod.HardenedMooncakeConnectorWorker._build_transfer_params

    async def build(self, ready_reqs, *args, **kwargs):
        for _, m in ready_reqs:
            m.pdchaos_aborted = False
        return await orig(self, ready_reqs, *args, **kwargs)
    patch(mod.HardenedMooncakeConnectorWorker, "_build_transfer_params", build)


def _no_load_deadline(mod, patch) -> None:
    """LoadLedger.collect: no deadline; a load waits for P's word however long (upstream's 540 s)."""
    orig = LoadLedger.collect
    patch(LoadLedger, "collect", lambda self, now: orig(self, float("-inf")))


def _silence_acknowledges(mod, patch) -> None:
    """_cancel_round: a cancel nobody answered counts as acknowledged; the pull settles and the
    blocks go while P may still write."""
    orig = mod.HardenedMooncakeConnectorWorker._cancel_round

    async def cancel_round(self, addr, tids):
        await orig(self, addr, tids)
        return set(tids.values())
    patch(mod.HardenedMooncakeConnectorWorker, "_cancel_round", cancel_round)


def _cancelled_blocks_kept(mod, patch) -> None:
    """_holds_blocks: P never reports a cancelled transfer's kept blocks in finished_sending (its
    entry is gone, so upstream's expiry never frees them either)."""
    patch(mod, "_holds_blocks", lambda meta: False)


def _reported_twice(mod, patch) -> None:
    """LoadLedger._finish: a reported load stays tracked, so it is reported again (its deadline,
    or a late outcome): one request, two terminal states."""
    def finish(self, ld, rep):
        rep.finished.add(ld.req_id)
        if ld.failed is not None:
            rep.failed_ids.add(ld.req_id)
            rep.failed_blocks |= ld.blocks
            rep.failures[ld.failed] = rep.failures.get(ld.failed, 0) + 1
    patch(LoadLedger, "_finish", finish)


def _bound_before_p_gives_up(mod, patch) -> None:
    """BOUND_MARGIN_S: D's bound on a pull ends before P's own wait for its prefill (abort timeout)
    does, so a pull settles at the bound while P may still write (upstream's "let P wait timeout
    first", reversed)."""
    patch(mod, "BOUND_MARGIN_S", -2.0)


def _abort_frees_at_once(mod, patch) -> None:
    """_cancelled: a load the client aborted gives its blocks back at once, not once its pulls
    settled (P may be writing or about to)."""
    async def cancelled(self, cancel):
        for rid, tracked in cancel.items():
            if tracked:
                self.settlements.want(rid, "recv")
                self._act(rid, "recv")
        self._cancel_wanted.update(r for r in cancel if self.settlements.is_open(r))
    patch(mod.HardenedMooncakeConnectorWorker, "_cancelled", cancelled)


def _settled_ids_cancelled_again(mod, patch) -> None:
    """The pull's cancel filter: requests already settled (answered OK by P) are cancelled again
    when the pull fails later (issue 43, 7d's class): Settlements.is_open for one pull says yes."""
    orig = Settlements.is_open
    patch(Settlements, "is_open", lambda self, req_id, pull=None: True if pull is not None else orig(self, req_id))


def _failure_reported_as_ok(mod, patch) -> None:
    """LoadLedger._finish: a failed load is reported in finished_recving without its failure (no
    invalid blocks): the request decodes on KV P never wrote (seed 001's rule broken)."""
    def finish(self, ld, rep):
        del self._loads[ld.req_id]
        rep.finished.add(ld.req_id)
    patch(LoadLedger, "_finish", finish)


def _cancelled_prefill_kept(mod, patch) -> None:
    """record_send_reqs: a prefill that ends after D cancelled its transfer is handed to upstream's
    bookkeeping as it is (no terminal check): its entry is gone (upstream raises KeyError and drops
    the batch) or waits for a pull that never comes; P keeps the blocks."""
    base = mod.HardenedMooncakeConnectorWorker.__mro__[1]

    async def record_send_reqs(self, metadata):
        metadata.reqs_not_processed = set(metadata.reqs_not_processed)
        try:
            await base.record_send_reqs(self, metadata)
        except KeyError:
            pass  # as upstream: the rest of the batch is dropped, its blocks held
    patch(mod.HardenedMooncakeConnectorWorker, "record_send_reqs", record_send_reqs)


def _write_never_cut(mod, patch) -> None:
    """WriteGuard: P's write runs to its end once started, its requester's link checked only before
    it (defect 7a's P half): a write in flight when the side channel starts refusing lands after D's
    fence."""
    patch(WriteGuard, "is_cut", lambda self: False)


def _gone_without_fence(mod, patch) -> None:
    """GONE_FENCE_S: D reads P as gone on the old rule alone (defect 7a's D half): after a
    blackhole, two refusals free the blocks a second before P's keepalive can see the reset."""
    patch(mod, "GONE_FENCE_S", 0.0)


BOTH = (1, 2)
# name -> (what it breaks, TP sizes it is caught at within the bounded examples, install)
MUTANTS = {
    "free-before-settled": ("Settlements.want", BOTH, _free_before_settled),
    "not-opened-means-settled": ("Settlements.opened", BOTH, _not_opened_means_settled),
    "cancel-every-open-id": ("cancel_targets", BOTH, _cancel_every_open_id),
    "cancelled-transfer-written": ("_build_transfer_params' abort mark", BOTH, _cancelled_meta_written),
    "no-load-deadline": ("LoadLedger.collect's deadlines", BOTH, _no_load_deadline),
    "cancelled-blocks-kept": ("_holds_blocks", BOTH, _cancelled_blocks_kept),
    "reported-twice": ("LoadLedger._finish", BOTH, _reported_twice),
    "failure-reported-as-ok": ("LoadLedger._finish's failure", BOTH, _failure_reported_as_ok),
    "abort-frees-at-once": ("_cancelled's settlement", BOTH, _abort_frees_at_once),
    "cancelled-prefill-kept": ("record_send_reqs' terminal check", BOTH, _cancelled_prefill_kept),
}

# Defect 7a's two halves (issue 43): the bounded examples do not reach them (measured: neither, nor
# both together, within 150 examples of the full space at TP 1), so each is asserted against the
# hand-written run that needs it (pd_model.directed_7a): name -> (what it breaks, the run, install)
DIRECTED = {
    "write-never-cut": ("WriteGuard: P's requester checked only before the write", "refuse", _write_never_cut),
    "gone-without-fence": ("GONE_FENCE_S: D's fence after the first refusal", "blackhole", _gone_without_fence),
}

# Not caught within the bounded examples (measured, 150-190 examples at TP 1 and 2, 2026-12-07), or not
# stably:
# what would make the model find them is listed in docs/interleavings.md.
NOT_CAUGHT = {
    # caught at TP 2 only, within 31-54 examples in one process and not within 150 in another
    # (the example sequence differs with what ran before in the process): not asserted
    "complete-on-the-first-ok": _complete_on_the_first_ok,
    "ack-while-writing": _ack_while_writing,
    "silence-acknowledges": _silence_acknowledges,
    "gone-on-refusals-alone": _gone_on_refusals_alone,  # masked: D's 1 s cancel round runs first
    "gone-after-loss-alone": _gone_after_loss_alone,
    "requester-never-checked": _requester_never_checked,  # TP 2 once, not stable
    "late-pull-served": _late_pull_served,  # needs a cancel to overtake its pull
    "bound-before-p-gives-up": _bound_before_p_gives_up,  # TP 1: RequesterLinks saves it; TP 2 at 153
    "settled-ids-cancelled-again": _settled_ids_cancelled_again,  # TP 2 at 177
}

"""A saved run, judged again: the check input of a run folder's journal and its checks, found
from the journal's meta line through the family registry (the only place the checks meet the
families), then the checks re-run with the options and applicability the run saved."""

from __future__ import annotations

from pathlib import Path

from nodekit import journal as J

from .checks import Checker, CheckInput, CheckResult, checks_for, run_checks, run_logs
from .family import get_family
from .triggers import registry_for


def load_input(journal_path: str | Path, records: list[dict] | None = None) -> tuple[CheckInput, dict[str, Checker]]:
    """The check input of a saved run and the checks its family runs (found from the meta line);
    ``records`` replaces the journal's own (a run judged as another target)."""
    jp = Path(journal_path)
    records = J.read_journal(jp) if records is None else records
    name = J.meta(records).get("family")
    if not isinstance(name, str) or not name:
        raise ValueError("its meta line names no family")
    family = get_family(name)
    inp = CheckInput(records, run_logs(jp, records), family.log_secrets(jp.parent), family.log_pattern,
                     family.saved_inputs(jp.parent), bool(getattr(family, "client_tally", False)),
                     registry_for(family))
    return inp, checks_for(family)


def check_saved(journal_path: str | Path, records: list[dict] | None = None) -> list[CheckResult]:
    """Re-run the checks of one saved scenario run, with the options and applicability it saved
    (or those of ``records``' meta line)."""
    try:
        inp, checks = load_input(journal_path, records)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a malformed record: judged, not a crash
        return [CheckResult("harness_integrity", False, f"the journal cannot be read as a history: "
                                                        f"{type(exc).__name__}: {exc}")]
    return run_checks(inp, saved_config(inp.meta), checks, inp.meta.get("not_applicable") or {})


def saved_config(meta: dict) -> dict:
    """The check options a run saved; a check the run did not know yet (saved before it existed)
    gets what its family says today (e.g. an opt-in check stays off), never its bare default."""
    saved = meta.get("checks") or {}
    return {**{k: dict(v) for k, v in get_family(meta["family"]).check_defaults.items() if k not in saved}, **saved}

"""Every hardened guarantee in connector_patch/DESIGN.md maps to an upstream diff (issue 33).

The DESIGN tables of guarantees (P/D, layerwise, the AscendStore and store admin channels) end in an
"upstream diff" column: the numbers of the diffs in connector_patch/upstream/<project>/<version>/
that carry the row as a change to upstream's own files, then "not yet: ..." for a part no diff
carries. Checked here: every row names at least one diff that exists, each named diff's
``Guarantee:`` header is about that connector, and the rows with a part not yet carried are exactly
the ones listed below (a new guarantee without a diff, or a gap closed without saying so, fails)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from connector_patch.upstream import read_series

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "connector_patch" / "DESIGN.md"
pytestmark = pytest.mark.timeout(60)

# table (its header's first cells) -> the series it maps to, and the word its diffs' Guarantee: names
TABLES = {
    "| guarantee | override (hardened class) |": (("vllm", "0.32.0"), ("pd ", "quiet waiting")),
    "| guarantee | override (upstream path it changes) |": (("vllm-ascend", "0.23.0.post1"), ("layerwise",)),
    "| upstream (vllm-ascend 0.23.0.post1, `kv_pool/ascend_store/`) | hardened | why |":
        (("vllm-ascend", "0.23.0.post1"), ("AscendStore",)),
    "| upstream (vLLM 0.32.0, the store connector": (("vllm", "0.32.0"), ("store ",)),
}
# rows with a part no diff carries yet (connector_patch/upstream/vllm/0.32.0/pd-notes.md, "Left out"): the first
# words of the row's guarantee cell -> the part. Empty since diffs 04, 17, 18 and 19 (2026-12-06): a row that
# says "not yet" again must be listed here, and pd-notes.md must say why.
NOT_YET: dict[str, str] = {}


def _rows(header_prefix: str) -> tuple[list[str], list[list[str]]]:
    lines = DESIGN.read_text(encoding="utf-8").splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith(header_prefix)]
    assert len(starts) == 1, f"DESIGN.md: {len(starts)} tables start with {header_prefix!r}"
    head = [c.strip() for c in lines[starts[0]].strip("|").split("|")]
    rows = []
    for ln in lines[starts[0] + 2:]:
        if not ln.startswith("| "):
            break
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        assert len(cells) == len(head), f"DESIGN.md: a row of {header_prefix!r} has {len(cells)} cells, not {len(head)}"
        rows.append(cells)
    return head, rows


@pytest.mark.parametrize("header_prefix", list(TABLES))
def test_every_guarantee_row_names_an_upstream_diff_that_carries_it(header_prefix: str) -> None:
    (project, version), words = TABLES[header_prefix]
    diffs = {d.number: d for d in read_series(project, version)}
    head, rows = _rows(header_prefix)
    assert head[-1] == "upstream diff", f"DESIGN.md table {header_prefix!r}: its last column is {head[-1]!r}"
    assert rows, f"DESIGN.md table {header_prefix!r} has no row"
    for cells in rows:
        row, cell = cells[0][:60], cells[-1]
        named = [int(n) for n in re.findall(r"`(\d\d)`", cell)]
        gap = cell.startswith("not yet") or "; not yet:" in cell
        assert named or gap, f"{row!r}: its upstream diff cell names no diff: {cell!r}"
        for n in named:
            assert n in diffs, f"{row!r} names diff {n:02d}, which {project} {version}'s series does not hold"
            g = diffs[n].header.get("Guarantee", "")
            assert any(w in g for w in words), f"{row!r} -> {diffs[n].name}: its Guarantee: is not about {words}"
        if gap:
            key = next((k for k in NOT_YET if cells[0].startswith(k)), None)
            assert key is not None, f"{row!r}: a part no diff carries, not listed in NOT_YET (say so, or write the diff)"


def test_the_rows_not_yet_carried_are_the_known_ones_and_pd_notes_says_why() -> None:
    _, rows = _rows("| guarantee | override (hardened class) |")
    gaps = {k for cells in rows for k in NOT_YET if cells[0].startswith(k)
            and (cells[-1].startswith("not yet") or "; not yet:" in cells[-1])}
    assert gaps == set(NOT_YET), f"NOT_YET lists rows that are carried now (or gone): {set(NOT_YET) - gaps}"
    notes = (REPO / "connector_patch/upstream/vllm/0.32.0/pd-notes.md").read_text(encoding="utf-8")
    left_out = notes.split("## Left out, and why", 1)[1].lower()
    for what in NOT_YET.values():
        assert what.split()[-1] in left_out, f"pd-notes.md's 'Left out' does not say why {what!r} is not carried"


def test_a_row_without_a_diff_is_refused(tmp_path: Path, monkeypatch) -> None:
    """The check itself: a guarantee row whose cell names nothing fails it."""
    text = DESIGN.read_text(encoding="utf-8").replace("| `12` |\n", "| |\n", 1)
    assert text != DESIGN.read_text(encoding="utf-8")
    fake = tmp_path / "DESIGN.md"
    fake.write_text(text, encoding="utf-8")
    monkeypatch.setitem(globals(), "DESIGN", fake)
    with pytest.raises(AssertionError, match="names no diff"):
        for prefix in TABLES:
            test_every_guarantee_row_names_an_upstream_diff_that_carries_it(prefix)

"""harness/ci/suites.py reads the CI suite rows each family brings (families/*/ci_suites.json)
with the standard library, and names no suite itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.ci import suites as S

pytestmark = pytest.mark.timeout(30)

ROW = {"name": "alpha", "order": 2, "why": "a test suite", "path": "scenarios/alpha/", "args": [],
       "runner": {"cpu": "linux-amd64-cpu-4-hk", "ascend": "linux-aarch64-a2b3-0"}, "timeout": 10,
       "default": ["cpu"], "setup": []}


def _root(tmp_path: Path, files: dict[str, object]) -> Path:
    for fam, doc in files.items():
        d = tmp_path / "families" / fam
        d.mkdir(parents=True)
        (d / "ci_suites.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return tmp_path


def test_every_familys_rows_in_their_order(tmp_path: Path) -> None:
    root = _root(tmp_path, {"b": {"suites": [ROW]}, "a": {"suites": [{**ROW, "name": "beta", "order": 1}]}})
    got = S.load_suites(root)
    assert list(got) == ["beta", "alpha"] and got["alpha"]["default"] == ("cpu",)
    assert "name" not in got["alpha"] and "order" not in got["alpha"]


@pytest.mark.parametrize("doc, message", [
    ({"suites": [{**ROW, "colour": "red"}]}, "families/a/ci_suites.json: suite 'alpha': unknown key 'colour'"),
    ({"suites": [{k: v for k, v in ROW.items() if k != "runner"}]}, "families/a/ci_suites.json: suite 'alpha': missing 'runner'"),
    ("{not json", "families/a/ci_suites.json: not a suite file: JSONDecodeError"),
    ({"rows": []}, "families/a/ci_suites.json: not a suite file: KeyError"),
])
def test_a_malformed_file_is_one_error_naming_it(tmp_path: Path, doc, message: str) -> None:
    with pytest.raises(S.SelectError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        S.load_suites(_root(tmp_path, {"a": doc}))


def test_a_suite_declared_by_two_families_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(S.SelectError, match="suite 'alpha' is declared twice"):
        S.load_suites(_root(tmp_path, {"a": {"suites": [ROW]}, "b": {"suites": [ROW]}}))


def test_this_checkouts_suites_come_from_the_families() -> None:
    root = Path(S.__file__).resolve().parents[2]
    declared = {row["name"] for f in (root / "families").glob("*/ci_suites.json")
                for row in json.loads(f.read_text())["suites"]}
    assert set(S.SUITES) == declared and {"lookup", "pd", "ascend-cpu", "pd-long"} <= declared
    for name, row in S.SUITES.items():
        assert (root / row["path"]).is_dir(), name

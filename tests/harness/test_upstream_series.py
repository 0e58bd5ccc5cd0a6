"""``pdchaos upstream check --series``: a project with two series (vllm-ascend's release and its pinned main
commit) is proven one series at a time; an unknown series is one clear error. Only ``--list`` runs here
(it needs no set-up); the before/after runs are ``pdchaos upstream check`` itself (docs/upstream.md)."""

from __future__ import annotations

import pytest

from connector_patch.upstream import read_series
from harness.cli.main import main

pytestmark = pytest.mark.timeout(120)


def test_series_picks_one_of_a_projects_series(capsys) -> None:
    assert main(["upstream", "check", "--list", "--project", "vllm-ascend", "--series", "main-182b75e"]) == 0
    out = capsys.readouterr().out
    heads = [ln for ln in out.splitlines() if ln and not ln.startswith(" ")]
    assert heads == ["vllm-ascend main-182b75e:"]
    listed = [ln.split(":", 1)[0].strip() for ln in out.splitlines()
              if ln.startswith("  ") and ln.split(":", 1)[0].strip().endswith(".diff")]
    assert listed == [d.name for d in read_series("vllm-ascend", "main-182b75e")]
    assert main(["upstream", "check", "--list", "--project", "vllm-ascend", "--series", "0.23.0.post1"]) == 0
    heads = [ln for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith(" ")]
    assert heads == ["vllm-ascend 0.23.0.post1:"]


def test_both_series_are_listed_without_series(capsys) -> None:
    assert main(["upstream", "check", "--list", "--project", "vllm-ascend"]) == 0
    heads = sorted(ln for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith(" "))
    assert heads == ["vllm-ascend 0.23.0.post1:", "vllm-ascend main-182b75e:"]


def test_an_unknown_series_is_one_error(capsys) -> None:
    assert main(["upstream", "check", "--list", "--series", "main-0000000"]) == 2
    captured = capsys.readouterr()
    err = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert len(err) == 1 and "--series 'main-0000000'" in err[0] and "main-182b75e" in err[0]
    assert "Traceback" not in captured.err + captured.out

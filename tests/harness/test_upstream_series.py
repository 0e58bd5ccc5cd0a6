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


HEADER = "Subject: s\nDefect: d\nGuarantee: g\nScenarios: none\nTests: tests/test_x.py\nDepends: none\n"


def _diff(tmp_path, name: str, header: str, lines: int, test_lines: int = 0):
    from connector_patch.upstream import read_diff

    body = "".join(f"+x{i} = {i}\n" for i in range(lines))
    tests = "".join(f"+t{i} = {i}\n" for i in range(test_lines))
    text = (header + f"diff --git a/pkg/m.py b/pkg/m.py\n--- /dev/null\n+++ b/pkg/m.py\n@@ -0,0 +1,{lines} @@\n{body}"
            + f"diff --git a/tests/test_x.py b/tests/test_x.py\n--- /dev/null\n+++ b/tests/test_x.py\n"
            + f"@@ -0,0 +1,{test_lines} @@\n{tests}")
    f = tmp_path / name
    f.write_text(text)
    return read_diff(f)


def test_a_diff_over_400_source_lines_needs_a_size_field_and_tests_do_not_count(tmp_path) -> None:
    """The size gate of ``pdchaos upstream check``: 401 source lines without ``Size:`` fail it, naming
    the count; with a ``Size:`` field they pass; 400 source lines and 900 test lines pass."""
    from harness.upstream_gates import SIZE_LIMIT, size_gate

    assert SIZE_LIMIT == 400
    big = size_gate(_diff(tmp_path, "01-big.diff", HEADER, 401), SIZE_LIMIT)
    assert not big.ok and "401 source lines" in big.line() and "Size:" in big.line()
    said = size_gate(_diff(tmp_path, "02-said.diff", HEADER + "Size: one new module and its only user\n", 401),
                     SIZE_LIMIT)
    assert said.ok and "Size: field" in said.line()
    edge = _diff(tmp_path, "03-edge.diff", HEADER, 400, test_lines=900)
    assert edge.source_lines() == 400 and size_gate(edge, SIZE_LIMIT).ok


@pytest.mark.parametrize("project, version", [("vllm", "0.32.0"), ("vllm-ascend", "0.23.0.post1"),
                                              ("vllm-ascend", "main-182b75e")])
def test_every_diff_of_the_series_passes_the_size_gate(project, version) -> None:
    """No diff of a shipped series is over 400 source lines without its written reason."""
    from harness.upstream_gates import SIZE_LIMIT, size_gate

    failing = [f"{d.name}: {size_gate(d, SIZE_LIMIT).line()}" for d in read_series(project, version)
               if not size_gate(d, SIZE_LIMIT).ok]
    assert not failing, failing

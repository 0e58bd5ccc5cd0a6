"""``pdchaos doctor``: the real command in a subprocess, checked against what the machine really has."""

from __future__ import annotations

import json
import os
import shutil
import time
import subprocess
import sys
from pathlib import Path

import pytest

from faults import netns
from faults.toxiproxy import PINNED_VERSION, binary_version, find_binary
from harness.cli.doctor import CHECK_NAMES

ROOT = Path(__file__).resolve().parents[2]


def doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", "doctor", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.mark.timeout(60)
def test_json_reports_what_is_there():
    res = doctor("--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    names = tuple(c["name"] for c in report["checks"])
    assert names[:len(CHECK_NAMES)] == CHECK_NAMES
    # then each family's own set-up pieces: the P/D node stack step by step, and the tiny model
    family_pieces = names[len(CHECK_NAMES):]
    assert "pd-node-stack/locked" in family_pieces and "pd-node-stack/import-check" in family_pieces
    assert "pd-node-stack/libibverbs.so.1" in family_pieces and "pd-tiny-model" in family_pieces
    for c in checks.values():
        assert bool(c["disables"]) == (not c["ok"]), c  # every absence says what it disables

    tp = checks["toxiproxy"]
    path = find_binary()
    assert tp["path"] == path
    if path is not None:
        version = binary_version(path)
        assert tp["version"] == version
        assert tp["pinned"] == checks["toxiproxy-pinned"]["ok"] == (version == PINNED_VERSION)
        assert tp["answers"] is tp["ok"]
    assert checks["root"]["ok"] == (os.geteuid() == 0)
    for tool in ("ip", "iptables", "tc"):
        assert checks[tool]["ok"] == (shutil.which(tool) is not None)
        assert checks[tool]["path"] == shutil.which(tool)
    assert checks["go"]["ok"] == (checks["go"]["path"] is not None)
    if os.geteuid() == 0 and shutil.which("ip"):
        assert checks["netns"]["ok"] == netns.netns_supported()[0]
        # its probes are gone; one the other pytest worker's probe has at this moment goes within its call
        deadline = time.monotonic() + 10
        while (left := [n for n in netns.list_namespaces() if n.startswith("pdc-probe-")]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left
    assert report["required_failed"] == []


@pytest.mark.timeout(60)
def test_missing_toxiproxy_is_reported_and_only_require_fails():
    env = {"PDCHAOS_TOXIPROXY_SERVER": "/nonexistent/toxiproxy-server"}
    res = doctor("--json", env=env)
    assert res.returncode == 0  # informational
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["toxiproxy"]["ok"] is False and checks["toxiproxy"]["path"] is None
    assert "skipped" in checks["toxiproxy"]["disables"]

    res = doctor("--require", "toxiproxy", "--require", "root", env=env)
    assert res.returncode == 1
    assert "NO  toxiproxy" in res.stdout
    assert "disables: link: toxiproxy scenarios" in res.stdout
    assert res.stdout.strip().splitlines()[-1] == "required but missing: toxiproxy" + \
        ("" if os.geteuid() == 0 else ", root")


@pytest.mark.timeout(30)
def test_unknown_require_is_bad_input():
    res = doctor("--require", "kubernetes")
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: --require: unknown check 'kubernetes'; known: "
                                         + ", ".join(CHECK_NAMES) + ", ")
    assert ", pd-node-stack/" in res.stderr and ", ascend-conf-stack/" in res.stderr  # the families' pieces
    assert res.stderr.strip().count("\n") == 0  # one line
    assert "Traceback" not in res.stderr and res.stdout == ""

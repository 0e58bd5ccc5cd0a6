"""``pdchaos repro``'s steps in the pd family's words (harness.family.Family.repro_steps finds this
module beside family.py): the requests the workload sent, as curl commands against the run's own
proxy (never the prompts themselves: a placeholder of the prompt's length), and the family's own
faults as what they do, with the command where one exists outside pd-chaos; and the report's
standalone/ folder (write_standalone: families/pd/standalone.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

# the family's proxy-hook faults: the proxy's control channel arms them; outside pd-chaos the same
# thing is a client or a proxy that behaves so
WITHOUT = {
    "fake_prefill_peer": "point D at a prefill peer that takes the pull and answers by mode {mode} "
                         "(no stock tool does it; pd-chaos's own peer: `pdchaos node pd-fake-prefill --mode {mode}`)",
    "abort_while_decode_waits": "send a request through the proxy and close the client's connection "
                                "{after} s into it, while D waits for P's KV (e.g. `curl --max-time {after} ...` below)",
    "abort_after_prefill": "let P prefill a request and never send it to D (a proxy that drops it after P's answer)",
    "hold_after_prefill": "hold the request between P's answer and D's pull (a proxy that waits there)",
    "bad_transfer_params": "send D a request whose kv_transfer_params lack transfer_id and remote_bootstrap_addr",
    "side_channel_garbage": "write bytes that are not msgpack to P's side channel (e.g. `printf 'garbage' | nc HOST PORT`)",
    "stop_rank": "freeze one tensor-parallel rank's worker process: `kill -STOP <its pid>` ... `kill -CONT <its pid>`",
}


def repro_steps(scenario: Any, target: str, run_dir: Path) -> list[tuple[str, str]]:
    steps: list[tuple[str, str]] = []
    try:
        cfg = json.loads((Path(run_dir) / "workload.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    url, model = cfg.get("proxy_url"), cfg.get("model")
    if url and model:
        n, out = int(cfg.get("prompt_tokens") or 0), int(cfg.get("output_tokens") or 16)
        body = {"model": model, "prompt": f"<any text of about {n} tokens>", "max_tokens": out, "temperature": 0}
        cmd = (f"curl -sS -m {float(cfg.get('request_timeout_s') or 30):g} -X POST {url.rstrip('/')}/v1/completions "
               f"-H 'Content-Type: application/json' -d {shlex.quote(json.dumps(body))}")
        rate, conc = cfg.get("rate"), cfg.get("concurrency")
        steps.append((f"the workload's request, through the P/D proxy ({conc} client(s), {rate} request(s)/s for "
                      f"{cfg.get('duration_s')} s; greedy, each answer compared with D's own)", cmd))
    for f in getattr(scenario, "faults", []):
        text = WITHOUT.get(f.type)
        if text is None:
            continue
        params = f.model_dump(mode="json", exclude={"type", "at", "for_"})
        try:
            text = text.format(**params)
        except (KeyError, IndexError):
            pass
        steps.append((f"fault {f.type} at {f.at:g} s for {f.for_:g} s: {text}", ""))
    return steps


def write_standalone(scenario: Any, report_dir: Path) -> Path:
    """``report_dir/standalone/`` (families/pd/standalone.py): the defect with vLLM alone, or, for a
    scenario it has no recipe for, a README saying what one needs."""
    from . import standalone

    env_text = standalone.collect_env(standalone.node_python()) if scenario.name in standalone.CASES else ""
    return standalone.write_standalone(Path(report_dir), scenario.name, env_text)

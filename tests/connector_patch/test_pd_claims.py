"""Claims match the code (issue 17, item 12).

* Every name of our code that ``connector_patch/DESIGN.md`` puts in backticks exists: dotted names
  (``ledger.LoadLedger``, ``Worker._fail``, ``HardenedLayerwiseWorker.get_finished``), private
  names (``_settled``), the names chained to one of them (``Worker._fail`` / ``_handle_failed_recv``),
  ``Hardened*`` classes, code words (``peer_gone``, ``BAD_CALL``) and file paths. Modules are read
  with ``ast``, never imported, so the check needs neither vLLM nor vllm-ascend. A name that is not
  ours must be in the declared upstream vocabulary below, and when the node envs are installed the
  vocabulary is checked against upstream's installed source (vLLM 0.32.0, vllm-ascend 0.23.0.post1).
* Sphinx references (``:class:``, ``:meth:``...) in connector_patch's docstrings name existing code.
* The hardened Mooncake connector exports everything vLLM's own MooncakeConnector exports: the same
  worker stats go through vLLM's ``KVConnectorLogging`` (the "KV Transfer metrics" log line) and
  ``KVConnectorProm`` (what ``PrometheusStatLogger`` builds from ``build_prom_metrics``) for both
  connectors, in the P/D node env's Python; no server is started.
"""

from __future__ import annotations

import ast
import builtins
import glob
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "connector_patch"
DESIGN = PKG / "DESIGN.md"
PROBE_TIMEOUT_S = 280  # importing vLLM and torch: ~15 s on a quiet machine, minutes under load

# DESIGN.md's short names for the hardened Mooncake classes (its "Names in the tables" paragraph)
ALIASES = {"Worker": "pd.vllm_connector.HardenedMooncakeConnectorWorker",
           "Scheduler": "pd.vllm_connector.HardenedMooncakeConnectorScheduler"}

# Names of ours that the code builds rather than spells: token -> (file, text that builds it)
DERIVED = {
    "vllm_ascend_lookup_rpc_client_events_total": ("lookup/metrics.py", 'f"vllm_ascend_lookup_rpc_{side}_events"'),
    "vllm_ascend_lookup_rpc_server_events_total": ("lookup/metrics.py", 'f"vllm_ascend_lookup_rpc_{side}_events"'),
}

_MC = "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py"
_KV = "vllm/distributed/kv_transfer/kv_connector"
_AS = "vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store"
_LW = "vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_layerwise_connector.py"

# Upstream names DESIGN.md uses, with where they live (relative to site-packages). A dotted
# ``Class.member`` is looked up in that class; any other name as a word of the file.
UPSTREAM_VLLM = {
    "process_pulling_result": _MC,
    "_handle_failed_recv": _MC,
    "_remote_agents": _MC,
    "PullReqMeta.failed": _MC,
    "RCVTIMEO": _MC,
    "FINISHED_LENGTH_CAPPED": "vllm/v1/request.py",
    "finished_sending": "vllm/v1/outputs.py",
    "update_connector_output": f"{_KV}/v1/base.py",
    "build_prom_metrics": f"{_KV}/v1/base.py",
    "build_kv_connector_stats": f"{_KV}/v1/base.py",
    "get_block_ids_with_load_errors": f"{_KV}/v1/base.py",
    "KVOutputAggregator": f"{_KV}/utils.py",
    "KVConnectorLogging": f"{_KV}/v1/metrics.py",
    "KVConnectorProm": f"{_KV}/v1/metrics.py",
    "MooncakeKVConnectorStats": f"{_KV}/v1/mooncake/stats.py",
    "MooncakePromMetrics": f"{_KV}/v1/mooncake/stats.py",  # only in its TODO: not written upstream
    "has_requests": "vllm/v1/core/sched/scheduler.py",
    "SpinCondition": "vllm/distributed/device_communicators/shm_broadcast.py",
    "busy_loop_s": "vllm/distributed/device_communicators/shm_broadcast.py",
    "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT": "vllm/envs.py",
}
UPSTREAM_ASCEND = {
    "LookupKeyClient": f"{_AS}/pool_scheduler.py",
    "LookupKeyServer": f"{_AS}/ascend_store_connector.py",
    "AscendStoreConnector.__init__": f"{_AS}/ascend_store_connector.py",
    "KVPoolScheduler.client": f"{_AS}/pool_scheduler.py",
    "KVPoolScheduler.get_num_new_matched_tokens": f"{_AS}/pool_scheduler.py",
    "LookupKeyClient.lookup": f"{_AS}/pool_scheduler.py",
    "KVCacheRecvingLayerThread.run": _LW,
    "kv_send_thread.request_queue": f"{_AS}/pool_worker.py",
    "m_store.store": f"{_AS}/pool_worker.py",
    "pool_worker.lookup_scheduler": f"{_AS}/ascend_store_connector.py",
}
# Neither ours nor upstream's code: tools, other libraries, environment variables
OTHER = {"zmq.Again": "pyzmq", "REQ_RELAXED": "libzmq socket option", "vllm.general_plugins": "entry point group",
         "PYTHONPATH": "environment",
         "VLLM_ENGINE_KV_WAKE": "environment: vLLM diffs 01/04/18's opt-in switch (connector_patch/upstream/vllm)",
         "VLLM_SHM_READER_ADAPTIVE_SPIN": "environment: vLLM diff 02's opt-in switch",
         "PATCHED_VLLM_ENV": "the harness's patched-target node env (families/pd/vllm_node.py)"}
BUILTINS = frozenset(dir(builtins))
UPSTREAM_PATHS = (
    "vllm/", "vllm_ascend/", "kv_pool/ascend_store/", "kv_p2p/mooncake_layerwise_connector.py",
    "ascend_store_connector.py", "mooncake/stats.py",
)


# --------------------------------------------------------------------------- our code, by ast


@dataclass
class Index:
    modules: dict[str, Path] = field(default_factory=dict)  # "pd.ledger" -> file ("pd" -> pd/__init__.py)
    members: dict[str, set[str]] = field(default_factory=dict)  # module or class qualname -> names defined
    bases: dict[str, list[str]] = field(default_factory=dict)  # class qualname -> last names of its bases
    classes: dict[str, list[str]] = field(default_factory=dict)  # class name -> qualnames
    defined: set[str] = field(default_factory=set)  # every name defined anywhere (def, class, assign, self.x)
    words: set[str] = field(default_factory=set)  # identifiers and words of string constants (no docstrings)


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


@lru_cache(maxsize=1)
def index() -> Index:
    ix = Index()
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG).with_suffix("").parts
        mod = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        ix.modules[mod] = path
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                ix.words.add(node.id)
            elif isinstance(node, ast.Attribute):
                ix.words.add(node.attr)
            elif isinstance(node, ast.arg):
                ix.words.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                ix.words.add(node.arg)
            elif isinstance(node, ast.ImportFrom) and node.module:
                ix.words.update(node.module.split("."))
            elif isinstance(node, ast.alias):
                ix.words.update(node.name.split(".") + ([node.asname] if node.asname else []))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                ix.words.update(re.findall(r"\w+", node.value))

        def scope(body: list[ast.stmt], qual: str) -> None:
            names = ix.members.setdefault(qual, set())
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                    ix.words.add(node.name)
                    if isinstance(node, ast.ClassDef):
                        cq = f"{qual}.{node.name}"
                        ix.classes.setdefault(node.name, []).append(cq)
                        ix.bases[cq] = [ast.unparse(b).split(".")[-1] for b in node.bases]
                        scope(node.body, cq)
                        for sub in ast.walk(node):  # self.x = ... in its methods: attributes
                            for t in (t for s in [sub] for t in _targets(s)):
                                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                                        and t.value.id == "self"):
                                    ix.members[cq].add(t.attr)
                elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    for t in _targets(node):
                        names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in node.names)
            ix.defined.update(names)

        scope(tree.body, mod)
    for names in ix.members.values():
        ix.defined.update(names)
    return ix


def _class_has(ix: Index, qual: str, name: str, seen: frozenset = frozenset()) -> bool:
    if name in ix.members.get(qual, ()):
        return True
    for base in ix.bases.get(qual, ()):  # inherited from another class of ours
        for bq in ix.classes.get(base, ()):
            if bq not in seen and _class_has(ix, bq, name, seen | {qual}):
                return True
    return False


def resolve(dotted: str) -> bool | None:
    """True: a name of ours that exists; False: a name of ours that does not; None: not ours."""
    ix = index()
    parts = dotted.removeprefix("connector_patch.").split(".")
    head, rest = parts[0], parts[1:]
    if head in ALIASES:
        qual = ALIASES[head]
    else:
        mods = [m for m in ix.modules if m == head or m.endswith("." + head)]
        if len(mods) == 1:
            qual = mods[0]
            while rest and f"{qual}.{rest[0]}" in ix.modules:  # a package's module
                qual = f"{qual}.{rest.pop(0)}"
        elif head in ix.classes:
            quals = ix.classes[head]
            if not rest:
                return True
            return any(_resolve_in(ix, q, rest) for q in quals)
        else:
            return None
    return _resolve_in(ix, qual, rest)


def _resolve_in(ix: Index, qual: str, rest: list[str]) -> bool:
    for i, name in enumerate(rest):
        if not _class_has(ix, qual, name):
            return False
        if f"{qual}.{name}" in ix.members:  # a class: go on into it
            qual = f"{qual}.{name}"
        elif i < len(rest) - 1:
            return False  # a function or attribute has no members we can see
    return True


# --------------------------------------------------------------------------- DESIGN.md's names

_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_CHAIN = re.compile(r"`([A-Za-z_][\w.]*)`((?:\s*/\s*`[A-Za-z_]\w*`)+)")


def _spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def _name_of(span: str) -> str | None:
    """The code name a span is, or None when it is an expression, a value or prose."""
    m = _NAME.match(span)
    if not m:
        return None
    rest = span[m.end():]
    if rest and not (rest.startswith("(") or rest.startswith(" ->") or rest.startswith("[")):
        return None
    return m.group(0)


def _is_path(span: str) -> bool:
    return bool(re.fullmatch(r"[\w.*{}-]+(/[\w.*{}-]*)+|[\w-]+\.(py|yaml|md|toml)", span))


def _kind(name: str) -> str:
    """Which names are checked: dotted, private, our classes, and code words."""
    if "." in name:
        return "dotted"
    if name.startswith("_") and not name.startswith("__"):
        return "private"
    if name.startswith("Hardened"):
        return "ours"
    if re.fullmatch(r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*", name) or "_" in name:
        return "word"  # CamelCase, snake_case, UPPER_CASE: a class, function, key or code
    return "skip"  # one lowercase word (``ok``, ``idle``, ``answer``) or an acronym


def _upstream(name: str) -> bool:
    return name in UPSTREAM_VLLM or name in UPSTREAM_ASCEND or name in OTHER


def design_problems(text: str) -> list[str]:
    ix = index()
    problems = []
    for span in _spans(text):
        if _is_path(span):
            if any(span.startswith(p) or span == p for p in UPSTREAM_PATHS):
                continue
            if not any(glob.glob(str(base / span)) for base in (ROOT, PKG)):
                problems.append(f"`{span}`: no such file in the repository or connector_patch/")
            continue
        if span.startswith("vllm:"):  # a Prometheus metric of ours: vllm:<name>_total{labels}
            metric = re.match(r"vllm:(\w+?)(_total)?(\{|$)", span)
            if not metric or metric.group(1) not in ix.words:
                problems.append(f"`{span}`: no such metric name in connector_patch")
            continue
        name = _name_of(span)
        if name is None:
            continue
        kind = _kind(name)
        if kind == "skip" or _upstream(name) or name in BUILTINS:
            continue
        if name in DERIVED:
            rel, needle = DERIVED[name]
            if needle not in (PKG / rel).read_text():
                problems.append(f"`{span}`: {rel} no longer builds it ({needle})")
            continue
        if kind == "dotted":
            found = resolve(name)
            if found is None:
                problems.append(f"`{span}`: neither our code nor a declared upstream name")
            elif not found:
                problems.append(f"`{span}`: not defined in connector_patch")
        elif kind in ("private", "ours"):
            if name not in ix.defined:
                problems.append(f"`{span}`: not defined in connector_patch (and not a declared upstream name)")
        elif name not in ix.words:
            problems.append(f"`{span}`: not in connector_patch's code (and not a declared upstream name)")
    for m in _CHAIN.finditer(text):  # `Cls.a` / `b` / `c`: b and c are members of Cls too
        head = m.group(1)
        if "." not in head or resolve(head) is None:
            continue
        container = head.rsplit(".", 1)[0]
        for tail in re.findall(r"`(\w+)`", m.group(2)):
            if not resolve(f"{container}.{tail}"):
                problems.append(f"`{head}` / `{tail}`: {container} has no {tail}")
    return problems


def test_every_name_of_our_code_in_design_exists() -> None:
    problems = design_problems(DESIGN.read_text())
    assert not problems, "DESIGN.md names code that does not exist:\n" + "\n".join(sorted(set(problems)))


def test_the_checker_catches_a_wrong_name() -> None:
    """The check is not vacuous: names that do not exist (the kind this issue found) are reported."""
    bad = ("`Worker._blocks_wanted`, `_blocks_wanted`, `ledger.LoadLedger.nope`, `settle.Nope`, "
           "`Scheduler.update_state_after_alloc` / `nope_method`, `HardenedNothing`, `reqs_to_release`, "
           "`lookup/nope.py`, `vllm:pdchaos_nope_total{code}`, `SomeUpstreamThing.run`")
    problems = design_problems(bad)
    for needle in ("Worker._blocks_wanted", "`_blocks_wanted`", "ledger.LoadLedger.nope", "settle.Nope",
                   "nope_method", "HardenedNothing", "reqs_to_release", "lookup/nope.py", "pdchaos_nope",
                   "SomeUpstreamThing.run"):
        assert any(needle in p for p in problems), (needle, problems)
    good = ("`Worker._fail` / `_handle_failed_recv`, `ledger.LoadLedger`, "
            "`scheduler.PoolScheduler.get_num_new_matched_tokens`, "
            "`HardenedRecvingLayerThread.expect` / `expire` / `fail`, `_holds_blocks`, `lookup/client.py`, "
            "`LookupClient.reset() -> bool`, `vllm:pdchaos_kv_failures_total{code}`, `process_pulling_result`")
    assert design_problems(good) == []


def test_the_upstream_vocabulary_is_used_by_design() -> None:
    """No stale entries: each declared upstream name still appears in DESIGN.md."""
    text = DESIGN.read_text()
    unused = [n for n in (*UPSTREAM_VLLM, *UPSTREAM_ASCEND, *OTHER)
              if not re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", text)]
    assert not unused, unused


_REF = re.compile(r":(mod|class|func|meth|attr):`~?([\w.]+)`")


def test_docstring_references_in_connector_patch_exist() -> None:
    ix = index()
    problems = []
    for mod, path in ix.modules.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for role, ref in _REF.findall(path.read_text()):
            if ref.startswith("."):  # relative to the module's package
                target = f"{pkg}.{ref[1:]}" if pkg else ref[1:]
                ok = target in ix.modules or resolve(target) is True
            elif ref.startswith("connector_patch."):
                target = ref.removeprefix("connector_patch.")
                ok = target in ix.modules or resolve(target) is True
            else:  # a name of this module or class, or another of ours
                ok = resolve(f"{mod}.{ref}") is True if mod else False
                ok = ok or ref.split(".")[-1] in ix.defined
            if not ok:
                problems.append(f"{path.relative_to(ROOT)}: :{role}:`{ref}`")
    assert not problems, problems


# --------------------------------------------------------------------------- upstream's installed source


def _upstream_problems(vocab: dict[str, str], site: Path) -> list[str]:
    problems = []
    for name, rel in vocab.items():
        path = site / rel
        if not path.exists():
            problems.append(f"{name}: {rel} not installed")
            continue
        text = path.read_text()
        parts = name.split(".")
        if len(parts) == 2 and parts[0][0].isupper():  # Class.member
            tree = ast.parse(text)
            cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == parts[0]), None)
            body = ast.dump(cls) if cls is not None else ""
            if cls is None or not re.search(rf"'{re.escape(parts[1])}'", body):
                problems.append(f"{name}: not in class {parts[0]} of {rel}")
        elif not all(re.search(rf"\b{re.escape(p)}\b", text) for p in parts):
            problems.append(f"{name}: not in {rel}")
    return problems


def _installed(env_factory) -> Path:
    env = env_factory(out=lambda line: None)
    if not env.installed():
        pytest.skip(f"the node env {env.name} is not installed here: run `pdchaos setup`")
    return env.site_packages()


def test_design_upstream_vllm_names_exist_in_the_installed_vllm() -> None:
    from stacks.vllm_cpu.recipe import pd_node_env

    problems = _upstream_problems(UPSTREAM_VLLM, _installed(pd_node_env))
    assert not problems, problems


def test_design_upstream_vllm_ascend_names_exist_in_the_installed_vllm_ascend() -> None:
    from stacks.ascend_cpu.recipe import ascend_conf_env

    problems = _upstream_problems(UPSTREAM_ASCEND, _installed(ascend_conf_env))
    assert not problems, problems


# --------------------------------------------------------------------------- metrics: upstream's kept

PROBE = r"""
import functools, json, pickle, types
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm.config import KVTransferConfig
from vllm.plugins import load_general_plugins
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging, KVConnectorProm
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.stats import MooncakeKVConnectorStats

load_general_plugins()
LABELS, VALUES = ["model_name", "engine"], {0: ["tiny", "0"]}


def worker_stats(cls, codes):
    # what one worker records in a step, then hands over (get_kv_connector_stats: clone_and_reset)
    # across the process boundary (pickled)
    s = cls()
    s.record_transfer(0.002, 1 << 20, 4)
    s.record_transfer(0.004, 1 << 21, 8)
    s.record_failed_transfer()
    s.record_failed_recv()
    s.record_kv_expired_req()
    for code in codes:
        s.record_code(code)
    assert not s.is_empty()
    return pickle.loads(pickle.dumps(s.clone_and_reset()))


def run(name, stats_cls, codes):
    cfg = KVTransferConfig(kv_connector=name, kv_role="kv_both", engine_id="claims")
    conn = KVConnectorFactory.get_connector_class(cfg)
    # two TP workers, aggregated as vLLM's KVOutputAggregator does, sent on as a dict (to_dict)
    agg = worker_stats(stats_cls, codes).aggregate(worker_stats(stats_cls, codes))
    payload = json.loads(json.dumps(agg.to_dict()))
    reg = CollectorRegistry()

    class Prom(KVConnectorProm):  # vLLM's own class, its metrics in a registry of this probe's
        _gauge_cls = functools.partial(Gauge, registry=reg)
        _counter_cls = functools.partial(Counter, registry=reg)
        _histogram_cls = functools.partial(Histogram, registry=reg)

    prom = Prom(types.SimpleNamespace(kv_transfer_config=cfg), LABELS, VALUES)
    prom.observe(payload, 0)
    lines = []
    logging = KVConnectorLogging(cfg)
    logging.observe(payload)
    logging.log(log_fn=lambda fmt, *a: lines.append(fmt % a))
    samples = {}
    for fam in reg.collect():
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            key = s.name + json.dumps(dict(sorted(s.labels.items())))
            samples[key] = s.value
    own = conn.build_prom_metrics.__func__ is not KVConnectorBase_V1.build_prom_metrics.__func__
    return {"cls": f"{conn.__module__}.{conn.__name__}", "own_build_prom_metrics": own,
            "has_prom": prom.prom_metrics is not None, "samples": samples, "log": lines,
            "data_keys": sorted(stats_cls().data)}


from connector_patch.pd.vllm_connector import HardenedStats

class Upstream(MooncakeKVConnectorStats):  # upstream's stats, with record_code a no-op
    def record_code(self, code):
        pass

out = {"upstream": run("MooncakeConnector", Upstream, []),
       "hardened": run("HardenedMooncakeConnector", HardenedStats, ["timeout", "unreachable", "unreachable"])}
only_codes = HardenedStats()
only_codes.record_code("peer_gone")
out["codes_only_is_empty"] = only_codes.is_empty()
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def metrics() -> dict:
    from families.pd.plugin_site import plugin_site
    from stacks.vllm_cpu.recipe import pd_node_env

    env = pd_node_env(out=lambda line: None)
    if not env.installed():
        pytest.skip("the P/D node stack is not installed here: run `pdchaos setup --only pd-node-stack`")
    child = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "PYTHONPATH")}
    child.update({"PYTHONPATH": str(plugin_site()), "HF_HUB_OFFLINE": "1", "PYTHONNOUSERSITE": "1"})
    r = subprocess.run([str(env.python), "-c", PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                       env=child, cwd="/")
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def _fields(log_line: str) -> dict[str, str]:
    body = log_line.split("KV Transfer metrics: ", 1)[1]
    return dict(f.split("=", 1) for f in re.split(r", (?=[A-Z])", body))


@pytest.mark.timeout(PROBE_TIMEOUT_S + 60)
def test_hardened_exports_every_prometheus_series_upstream_exports_and_its_failure_counter(metrics) -> None:
    up, hard = metrics["upstream"], metrics["hardened"]
    assert hard["cls"] == "connector_patch.pd.vllm_connector.HardenedMooncakeConnector"
    assert up["cls"].endswith("mooncake_connector.MooncakeConnector")
    # vLLM 0.32.0: upstream keeps the base build_prom_metrics (None), so it exports no series; the
    # comparison below becomes a real one the day upstream adds its own
    assert up["own_build_prom_metrics"] is up["has_prom"]
    for key, value in up["samples"].items():
        assert hard["samples"].get(key) == value, (key, value, hard["samples"].get(key))
    base = 'vllm:pdchaos_kv_failures_total{"code": "%s", "engine": "0", "model_name": "tiny"}'
    assert hard["samples"][base % "timeout"] == 2.0  # two workers, one each
    assert hard["samples"][base % "unreachable"] == 4.0


@pytest.mark.timeout(PROBE_TIMEOUT_S + 60)
def test_hardened_keeps_upstream_kv_transfer_metrics_log_line_and_adds_failure_codes(metrics) -> None:
    up, hard = metrics["upstream"], metrics["hardened"]
    assert set(up["data_keys"]) <= set(hard["data_keys"])
    assert len(up["log"]) == 1 and len(hard["log"]) == 1, (up["log"], hard["log"])
    up_fields, hard_fields = _fields(up["log"][0]), _fields(hard["log"][0])
    assert up_fields["Num successful transfers"] == "4" and up_fields["Num failed recvs"] == "2"
    for key, value in up_fields.items():
        assert hard_fields.get(key) == value, (key, value, hard_fields)
    assert hard_fields["Failures by code"] == "timeout=2, unreachable=4"


@pytest.mark.timeout(PROBE_TIMEOUT_S + 60)
def test_failure_codes_alone_are_reported_by_the_worker(metrics) -> None:
    """A step whose only news is a failure code is not empty (vLLM drops empty stats)."""
    assert metrics["codes_only_is_empty"] is False

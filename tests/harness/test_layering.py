"""The house's floors, guarded: dependencies point one way.

    nodekit          the ground floor: imports nothing of this project
    faults           may stand on nodekit
    harness          the neutral core: nodekit, faults, stacks' mechanics (never a family)
    reports          reads journals: nodekit, harness (never a family)
    stacks           node stacks: nodekit, harness (never a family)
    families/<name>  one system under test each: anything below, never another family, never the CLI
    runtimes/<name>  where nodes run (local processes, Kubernetes pods): nodekit, faults, harness
    connector_patch  the system under test: imports nothing of ours

``nodekit``, ``faults``, ``harness`` and ``reports`` do not even name a family in their code (the
plugin loader finds families by walking the ``families`` package, and the CI suite rows come from
each family's own file). No import circle anywhere. Only the modules that run inside a vLLM or
vllm-ascend process import vLLM, vllm-ascend or torch.
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
OURS = ("nodekit", "faults", "harness", "reports", "stacks", "families", "connector_patch", "runtimes")
FAMILIES = sorted(p.name for p in (ROOT / "families").iterdir() if (p / "__init__.py").is_file())
NEUTRAL = ("nodekit", "faults", "harness", "reports")
MAY_IMPORT = {
    "nodekit": set(),
    "faults": {"nodekit"},
    "harness": {"nodekit", "faults"},
    "reports": {"nodekit", "faults", "harness"},
    "stacks": {"nodekit", "faults", "harness"},
    "families": {"nodekit", "faults", "harness", "stacks", "connector_patch", "families"},
    "connector_patch": set(),
    "runtimes": {"nodekit", "faults", "harness"},
}
VLLM_SIDE = {"connector_patch/pd/vllm_connector.py", "connector_patch/vllm_plugin.py",
             "connector_patch/quiet/__init__.py",  # installs the runtime patches into vLLM
             "connector_patch/lookup/ascend_store.py", "connector_patch/layerwise/ascend_connector.py",
             "connector_patch/store/vllm_store.py",
             # run with a node env's python (harness/nodeenv/exec_node.py), never in the harness's
             "stacks/vllm_cpu/build_tiny_model.py", "families/lookup/ascend_server.py",
             "families/lookup/ascend_workload.py", "families/lookup/store_server.py",
             "families/lookup/store_workload.py", "families/layerwise/engine.py",
             "families/layerwise/stack.py",
             # the write-after-free watcher, loaded by vLLM itself in a decode node (a general plugin)
             "families/pd/node_instruments/pdchaos_waf/__init__.py",
             "families/pd/node_instruments/pdchaos_waf/phases.py",
             # copied into each P/D report's standalone/ folder and run there by a maintainer's own
             # vLLM venv (families/pd/standalone.py), never imported by the harness
             "families/pd/standalone_files/make_model.py",
             "families/pd/standalone_files/cpu_shim/sitecustomize.py",
             # the same for the reports on vllm-ascend's code (stacks/ascend_cpu/standalone.py)
             "families/lookup/standalone_files/lookup_parts.py",
             "families/layerwise/standalone_files/scenarios/layerwise-listener-garbage.py",
             "families/layerwise/standalone_files/layerwise_pair.py"}


def _files(pkg: str) -> list[Path]:
    # the plugin and stub packages a stack installs into its node env (stacks/*/pdchaos_*/) are
    # their own projects; nothing else is left out
    return sorted(p for p in (ROOT / pkg).rglob("*.py")
                  if not (p.relative_to(ROOT).parts[0] == "stacks"
                          and any(part.startswith("pdchaos_") for part in p.relative_to(ROOT).parts)))


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (at the top or inside a function), absolute dotted names."""
    tree = ast.parse(path.read_text(), str(path))
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = (package[:len(package) - node.level + 1] if node.level else [])
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def _top(name: str) -> str:
    return name.split(".")[0]


# the top floor of the core: the commands and the CI helpers show reports (the rest of the core
# never imports them; reports read what the core wrote)
TOP_OF_CORE = ("harness/cli/", "harness/ci/")


@pytest.mark.parametrize("pkg", list(MAY_IMPORT))
def test_each_floor_imports_only_what_lies_below(pkg: str) -> None:
    bad = {}
    for p in _files(pkg):
        ours = {_top(m) for m in _imports(p)} & set(OURS) - {pkg}
        if pkg == "families":
            ours -= {"families"}
        if str(p.relative_to(ROOT)).startswith(TOP_OF_CORE):
            ours -= {"reports"}
        wrong = sorted(ours - MAY_IMPORT[pkg])
        if wrong:
            bad[str(p.relative_to(ROOT))] = wrong
    assert not bad


def test_families_import_neither_each_other_nor_the_cli() -> None:
    bad = {}
    for fam in FAMILIES:
        for p in _files(f"families/{fam}"):
            wrong = sorted(m for m in _imports(p)
                           if (_top(m) == "families" and len(m.split(".")) > 1 and m.split(".")[1] != fam)
                           or m == "harness.cli" or m.startswith("harness.cli."))
            if wrong:
                bad[str(p.relative_to(ROOT))] = wrong
    assert not bad
    assert len(FAMILIES) >= 3, FAMILIES


_WORD = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, FAMILIES)) + r")(?![A-Za-z0-9])", re.IGNORECASE)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _words(name: str) -> str:
    """An identifier as words: ``use_pd`` -> "use pd", ``LookupTopology`` -> "Lookup Topology";
    Python's own names (``ProcessLookupError``) are not ours."""
    return "" if name in _BUILTINS else _CAMEL.sub(" ", name).replace("_", " ")


_BUILTINS = set(dir(builtins))


def _named_families(path: Path) -> list[str]:
    """The places ``path``'s code names a family (any case): a string or bytes constant (not a
    docstring), or an identifier holding a family's name as a word: names, attributes, functions,
    classes, arguments, keyword arguments, import aliases. Prose (docstrings, comments) may mention
    them. A name built at run time from pieces is beyond a static check (review catches that)."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for n in ast.walk(tree):
        text = None
        if isinstance(n, ast.Constant) and isinstance(n.value, (str, bytes)) and id(n) not in docs:
            value = n.value.decode("latin-1") if isinstance(n.value, bytes) else n.value
            text = value.replace("pd-chaos", "")  # the project's own name
        elif isinstance(n, ast.Name):
            text = _words(n.id)
        elif isinstance(n, ast.Attribute):
            text = _words(n.attr)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            text = _words(n.name)
        elif isinstance(n, ast.arg):
            text = _words(n.arg)
        elif isinstance(n, ast.keyword) and n.arg:
            text = _words(n.arg)
        elif isinstance(n, ast.alias):
            text = _words(n.asname or "") + " " + n.name.replace(".", " ")
        if text and _WORD.search(text):
            out.append(f"{path.name}:{getattr(n, 'lineno', '?')}: {_WORD.search(text).group(1).lower()}")
    return out


def test_the_neutral_core_names_no_family() -> None:
    found = [f"{p.relative_to(ROOT)}: {hit}" for pkg in NEUTRAL for p in _files(pkg) for hit in _named_families(p)]
    assert not found


RUNTIMES = sorted(p.name for p in (ROOT / "runtimes").iterdir() if (p / "__init__.py").is_file())


def test_the_neutral_core_and_the_families_name_no_runtime_but_the_default() -> None:
    """No `if k8s` anywhere but in its own folder: the core loads runtimes by name, a family's
    launch profile names one in data (its YAML), and the default ("local") is the only one the
    core may name."""
    other = [r for r in RUNTIMES if r != "local"]
    assert other, RUNTIMES
    word = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, other)) + r")(?![A-Za-z0-9])", re.IGNORECASE)
    found = []
    for pkg in NEUTRAL + ("families",):
        for p in _files(pkg):
            tree = ast.parse(p.read_text(), str(p))
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                    and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            for n in ast.walk(tree):
                text = (n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                        else _words(n.id) if isinstance(n, ast.Name) else _words(n.attr) if isinstance(n, ast.Attribute)
                        else None)
                if text and word.search(text):
                    found.append(f"{p.relative_to(ROOT)}:{getattr(n, 'lineno', '?')}")
    assert not found


def test_the_name_check_would_see_a_family_named_in_code(tmp_path: Path) -> None:
    """The guard above can fail: every way of spelling a family's name in code is found (outside
    the tree: a probe file in tmp_path), prose is not."""
    a, b = FAMILIES[0], FAMILIES[-1]
    probe = tmp_path / "probe.py"
    probe.write_text(f'''"""Mentions {a} in prose."""
X = "{a}"
Y = b"{b.upper()}"
class {b.capitalize()}Topology:
    pass
def use_{b}(in_{a}=1):
    return dict({a}=1)
import os as {a}
''')
    found = [h.split(": ")[-1] for h in _named_families(probe)]
    assert found.count(a) == 4 and found.count(b) == 3, found
    clean = tmp_path / "clean.py"
    clean.write_text(f'"""The {a} and {b} families are mentioned here only in prose."""\n# {a}\nX = 1\n')
    assert _named_families(clean) == []


def test_no_import_circle() -> None:
    """Among this project's modules (imports at the top and inside functions alike), no cycle."""
    mods = {_module(p): p for pkg in OURS for p in _files(pkg)}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for name in _imports(p):
            parts = name.split(".")
            while parts and ".".join(parts) not in mods:
                parts.pop()
            target = ".".join(parts)
            # a module importing its own package's __init__ (``from . import x``) is not a circle
            if parts and target != m and not m.startswith(target + "."):
                graph[m].add(target)
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(v: str, stack: list[str]) -> None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                cycles.append(stack[stack.index(w):] + [w])
            elif w not in state:
                visit(w, stack)
        stack.pop()
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            visit(v, [])
    assert not cycles, cycles[:3]


def test_pure_logic_imports_no_vllm_torch_or_zmq() -> None:
    """The rules of the P/D and layerwise connectors: everything in their folders but the one
    module each that subclasses vLLM's or vllm-ascend's class."""
    pure = [p for p in _files("connector_patch/pd") + _files("connector_patch/layerwise")
            if str(p.relative_to(ROOT)) not in VLLM_SIDE]
    assert len(pure) >= 7, "connector_patch/pd and layerwise hold the pure rules"
    # quiet waiting: the backoff, the spin window and the patched bodies are pure too (the wake
    # channel is pyzmq; only the package's install() touches vLLM)
    pure += [ROOT / "connector_patch" / "quiet" / n for n in ("backoff.py", "spin.py", "patch_engine_step.py",
                                                               "patch_spin_record_read.py", "patch_spin_wait.py")]
    bad = {str(p.relative_to(ROOT)): sorted({_top(m) for m in _imports(p)} & {"vllm", "torch", "zmq", "msgspec"})
           for p in pure}
    assert not {k: v for k, v in bad.items() if v}


def test_only_the_server_side_modules_import_vllm_or_torch() -> None:
    users = {str(p.relative_to(ROOT)) for pkg in OURS for p in _files(pkg)
             if {_top(m) for m in _imports(p)} & {"vllm", "torch", "vllm_ascend"}}
    assert users == VLLM_SIDE

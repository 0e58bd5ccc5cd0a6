"""Where a vLLM node finds the hardened connector: a small folder put on its ``PYTHONPATH``.

vLLM loads general plugins from the ``vllm.general_plugins`` entry point group, which
``importlib.metadata`` reads from any ``*.dist-info`` on ``sys.path``. The folder holds one such
dist-info (its ``entry_points.txt`` names :func:`connector_patch.vllm_plugin.register`) and a
symlink to this checkout's ``connector_patch`` package, so the node runs the code of the checkout
that starts it (installing it into the cached node venv would tie that venv to one checkout and
one version of the code). Nothing else of the checkout is importable from the node.

``pip install pd-chaos`` into a vLLM environment gives the same entry point (pyproject.toml).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

DIST = "pdchaos_connector_patch-0.0.0.dist-info"
ENTRY_POINTS = "[vllm.general_plugins]\npdchaos_hardened_mooncake = connector_patch.vllm_plugin:register\n"
METADATA = "Metadata-Version: 2.1\nName: pdchaos-connector-patch\nVersion: 0.0.0\n"


def package_dir() -> Path:
    import connector_patch

    return Path(connector_patch.__file__).resolve().parent


def plugin_site() -> Path:
    """The folder for this checkout (created or repaired idempotently; safe to race)."""
    return _site("plugin-site", package_dir(), DIST, ENTRY_POINTS, METADATA)


def _site(kind: str, pkg: Path, dist_name: str, entry_points: str, metadata: str) -> Path:
    """A folder under the cache holding one dist-info (``entry_points`` and ``metadata``) and a
    symlink to the package folder ``pkg``, named by ``pkg``'s path (created or repaired
    idempotently; safe to race: every write goes through a rename)."""
    from harness.nodeenv.venv import cache_root

    site = cache_root() / kind / hashlib.sha256(str(pkg).encode()).hexdigest()[:12]
    dist = site / dist_name
    dist.mkdir(parents=True, exist_ok=True)
    for name, text in (("entry_points.txt", entry_points), ("METADATA", metadata)):
        f = dist / name
        if not f.exists() or f.read_text() != text:
            tmp = f.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, f)
    link = site / pkg.name
    if not (link.is_symlink() and Path(os.readlink(link)) == pkg):
        tmp = site / f".{pkg.name}.{os.getpid()}.tmp"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(pkg, target_is_directory=True)
        os.replace(tmp, link)
    return site


INSTRUMENT_DIST = "pdchaos_instruments-0.0.0.dist-info"
INSTRUMENT_ENTRY_POINTS = ("[vllm.general_plugins]\npdchaos_waf = pdchaos_waf:register\n"
                           "pdchaos_phases = pdchaos_waf.phases:register\n")
INSTRUMENT_METADATA = "Metadata-Version: 2.1\nName: pdchaos-instruments\nVersion: 0.0.0\n"


def instrument_site() -> Path:
    """The folder of the harness's own node instruments (``families/pd/node_instruments``: the
    write-after-free watcher, active only where ``PDCHAOS_WAF_FILE`` is set, and the phase journal,
    only where ``PDCHAOS_PHASE_FILE`` is), put on a node's ``PYTHONPATH``, upstream or hardened;
    built as :func:`plugin_site` is."""
    pkg = Path(__file__).resolve().parent / "node_instruments" / "pdchaos_waf"
    return _site("instrument-site", pkg, INSTRUMENT_DIST, INSTRUMENT_ENTRY_POINTS, INSTRUMENT_METADATA)

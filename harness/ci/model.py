"""The model a launch profile gets: ``python3 -m harness.ci.model MODEL`` prints its folder.

MODEL is a folder (holding ``config.json``) or a ModelScope id ``ORG/NAME``, looked up where
vllm-ascend's runners keep models: the ModelScope cache (``$MODELSCOPE_CACHE``, else
``~/.cache/modelscope``), under ``hub/models/ORG/NAME`` (ModelScope's layout) or ``hub/ORG/NAME``
(older releases'). Nothing is downloaded. Exit 1 with one line naming where it looked when there
is no such model. Standard library only.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def candidates(model: str, env: dict | None = None) -> list[Path]:
    env = os.environ if env is None else env
    if model.startswith("/") or model.startswith("."):
        return [Path(model)]
    if not _ID.match(model):
        return []
    cache = Path(env.get("MODELSCOPE_CACHE") or Path(env.get("HOME", "~")).expanduser() / ".cache" / "modelscope")
    org, name = model.split("/")
    return [cache / "hub" / "models" / org / name, cache / "hub" / org / name]


def resolve(model: str, env: dict | None = None) -> Path:
    if not model or any(c.isspace() for c in model):
        raise ValueError(f"model {model!r}: a folder or a ModelScope id ORG/NAME, without spaces")
    looked = candidates(model, env)
    if not looked:
        raise ValueError(f"model {model!r}: expected a folder (/path) or a ModelScope id ORG/NAME")
    for p in looked:
        if (p / "config.json").is_file():
            return p
    raise ValueError(f"model {model!r}: no config.json in {', '.join(str(p) for p in looked)}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 -m harness.ci.model MODEL", file=sys.stderr)
        return 2
    try:
        print(resolve(args[0]))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

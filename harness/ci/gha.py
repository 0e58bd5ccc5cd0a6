"""The GitHub Actions workflow-command files: ``$GITHUB_OUTPUT``, ``$GITHUB_ENV``, ``$GITHUB_STEP_SUMMARY``.

Outside Actions (the variable unset) outputs go to stdout as ``name=value`` lines and the summary is
printed, so every command runs the same by hand.
"""

from __future__ import annotations

import os
import sys
import uuid

STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub's limit for one step's summary (bytes)


def _append(var: str, text: str) -> bool:
    path = os.environ.get(var)
    if not path:
        return False
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
    return True


def _kv(name: str, value: str) -> str:
    value = str(value)
    if "\n" in value:
        delim = f"ghadelim_{uuid.uuid4().hex}"
        return f"{name}<<{delim}\n{value}\n{delim}\n"
    return f"{name}={value}\n"


def set_output(name: str, value: object) -> None:
    if not _append("GITHUB_OUTPUT", _kv(name, str(value))):
        print(f"{name}={value}")


def set_env(name: str, value: object) -> None:
    if not _append("GITHUB_ENV", _kv(name, str(value))):
        print(f"export {name}={value}")


def summary_size() -> int:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def add_summary(markdown: str, limit: int = STEP_SUMMARY_LIMIT) -> None:
    """Append to the job summary, cut (at a line, with a note) to stay under GitHub's 1 MiB."""
    text = markdown if markdown.endswith("\n") else markdown + "\n"
    room = limit - summary_size() - 200
    data = text.encode("utf-8")
    if len(data) > room:
        cut = data[:max(room, 0)].decode("utf-8", "ignore")
        cut = cut[:cut.rfind("\n") + 1] if "\n" in cut else ""
        text = cut + "\n_(cut here: the job summary is limited to 1 MiB; summary.md in the artifact is whole)_\n"
    if not _append("GITHUB_STEP_SUMMARY", text):
        sys.stdout.write(text)

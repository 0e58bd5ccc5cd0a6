"""``pdchaos schema``: the scenario JSON Schema, for editor completion."""

from __future__ import annotations

import argparse

from ..schema import dump_json_schema


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: ARG001
    pass


def run(args: argparse.Namespace) -> int:  # noqa: ARG001
    print(dump_json_schema())
    return 0

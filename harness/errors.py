"""Errors the CLI turns into one clear line on stderr and exit code 2 (no traceback)."""

from nodekit.nodeio import NodeUsageError


class UsageError(NodeUsageError):
    """Bad input: a flag, a file, a scenario. The message names what and where."""


class HarnessError(Exception):
    """The harness itself could not do its job (a node did not start, a port was taken, ...)."""

"""``pdchaos``: ``main`` (harness/cli/main.py) and one module per subcommand beside it."""

from .main import main

__all__ = ["main"]

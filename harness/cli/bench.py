"""``pdchaos bench FAMILY ...``: a family's normal-path benchmark (targets side by side)."""

from .family_tool import make

add_arguments, run = make("bench")

"""``pdchaos fuzz FAMILY ...``: a family's wire fuzzer against a live node."""

from .cmd_family_tool import make

add_arguments, run = make("fuzz")

"""``pdchaos fuzz FAMILY ...``: a family's wire fuzzer against a live node."""

from .family_tool import make

add_arguments, run = make("fuzz")

"""The layerwise family's launch profile: which hardened connector class D and P run.

One built-in profile, ``cpu`` (the default: the conformance env on this machine, the hardened
target = ``connector_patch``'s ``HardenedMooncakeLayerwiseConnector``). ``--set`` changes its two
fields, which exist for mutation runs (``pdchaos mutate``, tests/mutants/system/layerwise.py):

* ``hardened_class``: ``module:Class``, a subclass of the hardened connector the ``hardened``
  target runs instead (checked in the node: anything else is refused at start);
* ``plugin_path``: an absolute folder put first on the nodes' ``sys.path`` (where that module is).

The ``upstream`` target is never changed by a profile.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.errors import UsageError

DEFAULT = "cpu"
_CLASS = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class LayerwiseProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = DEFAULT
    hardened_class: str | None = Field(None, description="module:Class the hardened target runs instead of "
                                                          "connector_patch's (a mutation run's)")
    plugin_path: str | None = Field(None, description="an absolute folder put first on the nodes' sys.path")

    @field_validator("hardened_class")
    @classmethod
    def _class(cls, v: str | None) -> str | None:
        if v is not None and not _CLASS.match(v):
            raise ValueError(f"{v!r} is not module:Class")
        return v

    @field_validator("plugin_path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not (Path(v).is_absolute() and Path(v).is_dir()):
            raise ValueError(f"{v!r} is not an absolute path of a folder")
        return v


def builtin_profiles() -> list[str]:
    return [DEFAULT]


def load_profile(spec: str | None, sets: list[str] | tuple[str, ...] = ()) -> LayerwiseProfile:
    """The profile ``spec`` (only ``cpu``) with ``KEY=VALUE`` changes; UsageError naming what is wrong."""
    if spec not in (None, DEFAULT):
        raise UsageError(f"--profile {spec!r}: family layerwise has one launch profile, {DEFAULT} "
                         f"(its nodes run vllm-ascend's code on CPU)")
    data: dict = {"name": DEFAULT}
    fields = sorted(set(LayerwiseProfile.model_fields) - {"name"})
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise UsageError(f"--set {item!r}: family layerwise takes KEY=VALUE with KEY one of {', '.join(fields)}")
        data[key] = value or None
    try:
        return LayerwiseProfile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise UsageError(f"--set {loc}: {err['msg'].removeprefix('Value error, ')}") from None

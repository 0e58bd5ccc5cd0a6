"""Scenario files: YAML validated by pydantic, errors located by file and line.

A scenario = topology + workload + fault schedule + checks + the verdict expected per target::

    name: slow-peer-above-deadline
    seed: 7
    deadline: 200ms            # the hardened client's lookup_rpc_timeout_ms
    tolerance: 150ms           # bounded_return allows deadline + tolerance
    topology: {transport: ipc, link: direct, block_size: 16, groups: 2, preload_blocks: 64}
    workload: {duration: 3s, concurrency: 2, rate: 40, mix: {full: 2, partial: 1, miss: 1}}
    faults:
      - {type: slow_peer, at: 1s, for: 1s, delay: 500ms}
    checks: {recovery: {within: 2}}     # defaults: every check; options per check
    expect: {hardened: pass, legacy: stall}

Fault entries are validated against the fault's own Params (faults/base.py registry), so an
unknown fault or attribute is an error at its line.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from faults.base import Duration, load_registry

from .checks import CHECKS
from .errors import UsageError

TARGETS = ("hardened", "legacy")
VERDICTS = ("pass", "fail", "stall", "skipped")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Topology(_Strict):
    transport: Literal["ipc", "tcp"] = "ipc"
    link: Literal["direct", "interposer", "toxiproxy", "netns"] = "direct"
    block_size: int = Field(16, ge=1, le=4096)
    groups: int = Field(1, ge=1, le=16)
    preload_blocks: int = Field(64, ge=1, le=100_000)
    backend_timeout: Duration = Field(4.0, description="the hardened server's backend_timeout_ms")

    @model_validator(mode="after")
    def _links(self) -> "Topology":
        if self.link in ("toxiproxy", "netns") and self.transport != "tcp":
            raise ValueError(f"link {self.link!r} needs transport: tcp")
        return self


class Mix(_Strict):
    full: int = Field(3, ge=0)
    partial: int = Field(2, ge=0)
    miss: int = Field(1, ge=0)
    hbm: int = Field(1, ge=0)
    multigroup: int = Field(1, ge=0)

    @model_validator(mode="after")
    def _some(self) -> "Mix":
        if sum(self.model_dump().values()) == 0:
            raise ValueError("at least one op kind needs a positive weight")
        return self


class Workload(_Strict):
    duration: Duration = 3.0
    concurrency: int = Field(2, ge=1, le=64, description="client workers (one REQ client each)")
    rate: float = Field(40.0, gt=0, le=20_000, description="ops/s over all workers")
    mix: Mix = Field(default_factory=Mix)
    prompt_blocks: tuple[int, int] = (2, 12)
    reset_at: Duration | None = Field(None, description="one admin reset at this time (needs concurrency 1: "
                                                        "every later op then expects a miss)")

    @model_validator(mode="after")
    def _ranges(self) -> "Workload":
        lo, hi = self.prompt_blocks
        if not 1 <= lo <= hi <= 4096:
            raise ValueError("prompt_blocks must be [lo, hi] with 1 <= lo <= hi <= 4096")
        if self.duration <= 0:
            raise ValueError("duration must be positive")
        if self.reset_at is not None and (self.concurrency != 1 or self.reset_at >= self.duration):
            raise ValueError("reset_at needs concurrency: 1 and a time within the duration")
        return self


class RandomFaults(_Strict):
    """A fault schedule drawn from the scenario seed: ``count`` faults picked from ``choices``, one
    in each of ``count`` equal slots of ``window`` (so they never overlap)."""

    count: int = Field(ge=1, le=50)
    window: tuple[Duration, Duration]
    length: tuple[Duration, Duration] = (0.2, 0.8)
    choices: list[dict[str, Any]] = Field(min_length=1)


_CHECK_NAMES = tuple(CHECKS)  # the YAML names are the checkers' own registry keys


class CheckOptions(_Strict):
    enabled: bool = True
    within: int = Field(1, ge=1, description="recovery: the first N ops after a window must include a success")
    tolerance: Duration | None = Field(None, description="bounded_return: overrides the scenario tolerance")
    slack: int = Field(0, ge=0, description="no_leaks: allowed extra threads/fds")


def _fault_union():
    registry = load_registry()
    models = []
    for name, cls in sorted(registry.items()):
        namespace = {
            "__annotations__": {"type": Literal[name], "at": Duration, "for_": Duration},
            "at": Field(..., description="start, counted from the workload start"),
            "for_": Field(..., alias="for", description="how long; the fault is healed after"),
            "model_config": ConfigDict(extra="forbid", populate_by_name=True, frozen=True),
            "__doc__": (cls.__doc__ or name).strip().splitlines()[0],
        }
        model = type(f"Fault_{name}", (cls.Params,), namespace)
        models.append(model)
    if not models:
        def _none(v: Any) -> Any:
            raise ValueError("no fault types are registered")
        return Annotated[dict, AfterValidator(_none)]
    if len(models) == 1:
        return models[0]
    return Annotated[Union[tuple(models)], Field(discriminator="type")]


class _ScenarioBase(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    description: str = ""
    seed: int = 0
    targets: list[Literal["hardened", "legacy"]] = Field(default_factory=lambda: list(TARGETS), min_length=1)
    deadline: Duration = 0.2
    tolerance: Duration = 0.15
    cap: Duration = Field(30.0, description="hard wall-clock cap of one scenario run")
    topology: Topology = Field(default_factory=Topology)
    workload: Workload = Field(default_factory=Workload)
    random_faults: RandomFaults | None = None
    checks: dict[Literal[_CHECK_NAMES], CheckOptions] = Field(default_factory=dict)  # type: ignore[valid-type]
    expect: dict[Literal["hardened", "legacy"], Union[Literal["pass", "fail", "stall"],
                                                       list[Literal["pass", "fail", "stall"]]]] = Field(
        default_factory=dict,
        description="the verdict expected per target (default pass); a list when several are honest "
                    "outcomes, e.g. [fail, stall] for a baseline that stalls only if a request was in flight")

    @model_validator(mode="after")
    def _sane(self):
        if self.workload.reset_at is not None and "legacy" in self.targets:
            raise ValueError("workload.reset_at: the legacy protocol has no reset; use targets: [hardened]")
        if self.deadline <= 0:
            raise ValueError("deadline must be positive")
        if self.cap <= self.workload.duration:
            raise ValueError("cap must be longer than workload.duration")
        for f in getattr(self, "faults", []):
            if f.at + f.for_ > self.workload.duration:
                raise ValueError(f"fault {f.type!r} at {f.at:g}s for {f.for_:g}s ends after the workload "
                                 f"({self.workload.duration:g}s)")
        return self

    def expected(self, target: str) -> str:
        """The expected verdict as text: "pass", or "fail|stall" for a list."""
        e = self.expect.get(target, "pass")
        return e if isinstance(e, str) else "|".join(e)

    def check_options(self, name: str) -> CheckOptions:
        return self.checks.get(name, CheckOptions())


_SCENARIO_MODEL = None


def scenario_model():
    """The Scenario model, built once the fault registry is loaded."""
    global _SCENARIO_MODEL
    if _SCENARIO_MODEL is None:
        _SCENARIO_MODEL = create_model("Scenario", __base__=_ScenarioBase,
                                       faults=(list[_fault_union()], Field(default_factory=list)))
    return _SCENARIO_MODEL


def json_schema() -> dict:
    return scenario_model().model_json_schema(by_alias=True)


# --------------------------------------------------------------------------- loading


class LoadedScenario:
    def __init__(self, model: Any, path: Path):
        self.model = model
        self.path = path
        self.faults = list(model.faults) + self._draw_random()

    @property
    def name(self) -> str:
        return self.model.name

    def _draw_random(self) -> list:
        rf = self.model.random_faults
        if rf is None:
            return []
        rng = random.Random(self.model.seed)
        model = scenario_model()
        out = []
        slot = (rf.window[1] - rf.window[0]) / rf.count  # one fault per slot: they never overlap
        for i in range(rf.count):
            choice = dict(rng.choice(rf.choices))
            length = min(rng.uniform(*rf.length), slot * 0.8)
            at = rf.window[0] + i * slot + rng.uniform(0.0, slot - length)
            choice.update({"at": f"{at * 1000:.0f}ms", "for": f"{length * 1000:.0f}ms"})
            out.append(choice)
        drawn = model.model_validate({"name": "drawn", "faults": out,
                                      "workload": {"duration": f"{self.model.workload.duration}s"}}).faults
        return sorted(drawn, key=lambda f: f.at)


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """Follow a pydantic error location through the YAML node tree to a line number (1-based)."""
    line = node.start_mark.line + 1 if node is not None else None
    fault_names = set(load_registry())
    prev: Any = None
    for part in loc:
        if node is None:
            break
        if isinstance(prev, int) and part in fault_names:
            prev = part
            continue  # the discriminator tag pydantic inserts after a list index: not a YAML key
        prev = part
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == part or (part == "for_" and k.value == "for"):
                    nxt = v
                    line = k.start_mark.line + 1
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            # a union tag (e.g. the fault type) or a leaf: stay where we are
            continue
    return line


def _fmt_loc(loc: tuple, fault_names: set[str]) -> str:
    out = ""
    prev: Any = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(prev, int) and (part in fault_names or str(part).startswith("function-")):
            pass  # the discriminator tag pydantic inserts after a list index
        else:
            out += ("." if out else "") + ("for" if part == "for_" else str(part))
        prev = part
    return out or "(top level)"


def _friendly(err: dict) -> str:
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] == "union_tag_invalid":
        tag = (err.get("ctx") or {}).get("tag")
        return f"unknown fault type {tag!r}; known: {', '.join(sorted(load_registry()))}"
    if err["type"] == "union_tag_not_found":
        return "missing 'type' (the fault name)"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return msg


def load_scenario(path: str | Path) -> LoadedScenario:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise UsageError(f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}:1: a scenario must be a mapping (name, workload, faults, ...)")
    model = scenario_model()
    try:
        scenario = model.model_validate(data)
    except ValidationError as exc:
        names = set(load_registry())
        lines = []
        for err in exc.errors():
            line = _line_of(node, err["loc"])
            where = f"{path}:{line}" if line else str(path)
            lines.append(f"{where}: {_fmt_loc(err['loc'], names)}: {_friendly(err)}")
        raise UsageError("\n".join(lines)) from None
    try:
        return LoadedScenario(scenario, path)
    except ValidationError as exc:
        raise UsageError(f"{path}: random_faults: {exc.errors()[0]['msg']}") from None


def collect(paths: list[str]) -> list[Path]:
    """Scenario files from files and folders (recursively, *.yaml / *.yml, sorted)."""
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            out.extend(sorted(q for q in path.rglob("*") if q.suffix in (".yaml", ".yml")))
        elif path.is_file():
            out.append(path)
        else:
            raise UsageError(f"{p}: no such file or folder")
    if not out:
        raise UsageError(f"no scenario files (*.yaml) in {', '.join(paths)}")
    return out


def load_all(paths: list[str]) -> list[LoadedScenario]:
    """Load every scenario; report ALL errors at once, and duplicate names."""
    loaded, errors, seen = [], [], {}
    for f in collect(paths):
        try:
            s = load_scenario(f)
        except UsageError as exc:
            errors.append(str(exc))
            continue
        if s.name in seen:
            errors.append(f"{f}: name {s.name!r} already used by {seen[s.name]}")
            continue
        seen[s.name] = f
        loaded.append(s)
    if errors:
        raise UsageError("\n".join(errors))
    return loaded


def dump_json_schema() -> str:
    return json.dumps(json_schema(), indent=2)

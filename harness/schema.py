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
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, TypeAdapter,
                      ValidationError, create_model, model_validator)

from faults.base import Duration, load_registry

from . import verdicts as V
from .phases import latest_end, phase_key_model
from .checks import CheckOptions, checks_for, options_for
from .errors import UsageError
from .family import Family, get_family, known_families

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RandomFaults(_Strict):
    """A fault schedule drawn from the scenario seed: ``count`` faults picked from ``choices``, one
    in each of ``count`` equal slots of ``window`` (so they never overlap)."""

    count: int = Field(ge=1, le=50)
    window: tuple[Duration, Duration]
    length: tuple[Duration, Duration] = (0.2, 0.8)
    choices: list[dict[str, Any]] = Field(min_length=1)


class _CheckTable(_Strict):
    """``checks:`` of a scenario: one optional field per check its family runs, each typed by that
    check's own options model (harness/checks.py, a family's checks.py); read like a mapping of
    the checks the scenario sets."""

    def items(self) -> list[tuple[str, CheckOptions]]:
        return [(n, getattr(self, n)) for n in type(self).model_fields
                if n in self.model_fields_set and getattr(self, n) is not None]

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.items()).get(name, default)


def _checks_model(family: str, fam: Family) -> type[_CheckTable]:
    models = options_for(fam)
    for name, opts in fam.check_defaults.items():  # the family's defaults obey the checks' own models
        if name not in models:
            raise UsageError(f"family {family!r}: check_defaults: no check {name!r}")
        try:
            models[name].model_validate(opts)
        except ValidationError as exc:
            raise UsageError(f"family {family!r}: check_defaults.{name}: {exc.errors()[0]['msg']} "
                             f"({'.'.join(map(str, exc.errors()[0]['loc']))})") from None
    fields = {name: (Optional[model], Field(None, description=f"options of the check {name}"))
              for name, model in models.items()}
    return create_model(f"Checks_{family}", __base__=_CheckTable, **fields)  # type: ignore[call-overload]


def _fault_union(family: Family):
    registry = load_registry(family.name)
    key = phase_key_model(family)
    models = []
    for name, cls in sorted(registry.items()):
        namespace = {
            "__annotations__": {"type": Literal[name], "at": Duration, "for_": Duration, "upon": Optional[key]},
            "at": Field(..., description="start, counted from the workload start (with `upon`: when the fault is "
                                         "armed, the earliest it may start)"),
            "for_": Field(..., alias="for", description="how long; the fault is healed after"),
            # left out of every dump of the entry's parameters: the schedule's timing, like at and for
            "upon": Field(None, exclude=True, description="start at a protocol phase instead (harness/phases.py): "
                        "{phase: NAME, offset: 0ms, nth: 1, within: 5s, node: ROLE}"),
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
    doc: dict[str, str] = Field(default_factory=dict, description="this scenario's row in docs/scenarios/ "
                                "(pdchaos docs): `fault`, what is injected in a few words, and per target what "
                                "it does, measured (prose); verdicts come from expect and the recorded run")
    family: str = Field(description="the system under test (families/<name>); every scenario names it")
    seed: int = 0
    deadline: Duration = 0.2
    tolerance: Duration = 0.15
    cap: Duration = Field(30.0, description="hard wall-clock cap of one scenario run, from the workload's start "
                          "(t0): node start-up has its own timeouts")
    random_faults: RandomFaults | None = None
    quick: bool = Field(False, description="one of the few scenarios of the first-result path (`pdchaos run "
                        "PATH --quick` runs only these): a new user's first before/after in minutes")

    @model_validator(mode="after")
    def _sane(self):
        if self.deadline <= 0:
            raise ValueError("deadline must be positive")
        if self.cap <= self.workload.duration:
            raise ValueError("cap must be longer than workload.duration")
        fam = get_family(self.family)
        for i, f in enumerate(getattr(self, "faults", [])):
            on = getattr(f, "upon", None)
            if on is None and f.at + f.for_ > self.workload.duration:
                raise ValueError(f"fault {f.type!r} at {f.at:g}s for {f.for_:g}s ends after the workload "
                                 f"({self.workload.duration:g}s)")
            if on is not None and latest_end(f) > self.workload.duration:
                raise ValueError(f"faults[{i}] ({f.type}): armed at {f.at:g}s, keyed on {on.phase} within "
                                 f"{on.within:g}s + offset {on.offset:g}s, for {f.for_:g}s: it may end at "
                                 f"{latest_end(f):g}s, after the workload ({self.workload.duration:g}s); shorten "
                                 f"upon.within or arm it earlier")
            only = fam.phase_targets.get(on.phase) if on is not None else None
            if only is not None and set(self.targets) - set(only):
                raise ValueError(f"faults[{i}].upon.phase: {on.phase} is seen only on {', '.join(only)}; this "
                                 f"scenario also runs {', '.join(sorted(set(self.targets) - set(only)))} "
                                 f"(set targets:, or key the fault on a phase every target shows)")
        unknown = sorted(set(self.doc) - {"fault"} - set(self.targets))
        if unknown:
            raise ValueError(f"doc: {', '.join(unknown)} is neither `fault` nor a target this scenario runs "
                             f"({', '.join(self.targets)})")
        self._check_triggers()
        validate_recovery_gaps(self, self.faults)
        validate_faults_fit(self, self.faults)
        self._check_expectations()
        get_family(self.family).validate(self)
        return self

    def _check_triggers(self) -> None:
        """Every scenario declares the events its claim rests on (harness/triggers.py): a list of
        triggers, or ``{none: REASON}`` when it has no fault. A scenario with faults cannot say none."""
        from .triggers import NoTriggers

        declared = getattr(self, "triggers", None)
        n_file = len(getattr(self, "faults", []))
        n_faults = n_file + (self.random_faults.count if self.random_faults is not None else 0)
        example = "- {type: ops_in_window, fault: 0}"
        if isinstance(declared, NoTriggers):
            if n_faults:
                raise ValueError(f"triggers: a scenario with faults cannot say none ({declared.none!r}): name the "
                                 f"events its claim rests on, e.g. `{example}` (a request in flight during fault "
                                 f"0's window; harness/triggers.py)")
            return
        if not declared:
            if n_faults:
                raise ValueError(f"triggers: missing: a scenario with faults names the events its claim rests on, "
                                 f"e.g. `triggers: [{example[2:]}]` (harness/triggers.py)")
            raise ValueError("triggers: missing: name the events this scenario's claim rests on, or say "
                             "`triggers: {none: \"<why>\"}` (a scenario without faults, e.g. a baseline)")
        for i, t in enumerate(declared):
            fid = getattr(t, "fault", None)
            if fid is not None and fid >= n_faults:
                drawn = f", {self.random_faults.count} drawn" if self.random_faults is not None else ""
                raise ValueError(f"triggers[{i}] ({t.type}): fault {fid} is not an entry of faults "
                                 f"(0-based, file order then drawn; the scenario has {n_file}{drawn})")

    def expected(self, target: str) -> str:
        """The expectation as text (harness/verdicts.py): ``pass``, ``fail[no_busy_wait]``, or
        alternatives ``fail[a]|stall[no_stall]``. Every target has one (validated)."""
        e = self.expect.get(target)
        base = get_family(self.family).derived_targets.get(target)
        if e is None and base is not None and base != target:  # claims what its base target claims
            return self.expected(base)
        if e is None:
            return ""  # not validated yet: no claim, so nothing matches it
        alts = e if isinstance(e, list) else [e]
        return V.text(V.Alternative(a, frozenset() if a == "pass" else None) if isinstance(a, str) else
                      V.Alternative(a.verdict, frozenset(a.failing), frozenset(a.may_fail)) for a in alts)

    def _check_expectations(self) -> None:
        """Every target the scenario runs has an expectation (no implicit ``pass``), and each
        names checks this scenario runs (not one it disables)."""
        missing = [t for t in self.targets if t not in self.expect]
        if missing:
            raise ValueError(f"expect: no expectation for target(s) {', '.join(missing)} that the scenario runs; "
                             f"add e.g. `{missing[0]}: pass` or `{missing[0]}: {{verdict: fail, failing: [CHECK]}}`")
        disabled = {n for n, o in self.checks.items() if not o.enabled}
        guarded = sorted(disabled & set(V.ERROR_CHECKS))
        if guarded:
            raise ValueError(f"checks: {', '.join(guarded)} cannot be disabled: when it fails the run cannot be "
                             f"judged at all")
        for target, e in self.expect.items():
            for a in (e if isinstance(e, list) else [e]):
                off = sorted((set(getattr(a, "failing", [])) | set(getattr(a, "may_fail", []))) & disabled)
                if off:
                    raise ValueError(f"expect.{target}: failing names {', '.join(off)}, which this scenario "
                                     f"disables (checks: ... enabled: false)")

    def check_options(self, name: str) -> CheckOptions:
        return self.checks.get(name) or CheckOptions()


def validate_faults_fit(scenario: Any, faults: list) -> None:
    """Every fault fits this topology (the link it needs, the roles it names): whatever the
    machine, a mismatch is an error here, not a skip at run time."""
    fam = get_family(scenario.family)
    registry = load_registry(fam.name)
    needs = set(fam.requirements(scenario))
    for f in faults:
        needs |= set(registry[f.type].requires)
    why = fam.unmet(scenario, needs)
    if why:
        raise ValueError(why)
    roles = fam.roles(scenario)
    for i, f in enumerate(faults):
        spec = getattr(f, "node", None)
        if roles is None or not isinstance(spec, str) or spec == "all":
            continue
        found = [r for r in roles if r.startswith(spec[:-1])] if spec.endswith(":*") else [r for r in roles if r == spec]
        if not found:
            raise ValueError(f"faults[{i}] ({f.type}): node {spec!r} names no role of this topology "
                             f"(roles: {', '.join(roles)})")


def merge_windows(spans: Any) -> list[list[float]]:
    """Fault windows ``(start, stop, heal allowance)`` merged where they overlap, in time order, as
    ``[start, stop, healed]``: healed = the latest time a fault of the window may still be healing
    (an earlier-ending fault with a longer heal may outlast the last one to end)."""
    merged: list[list[float]] = []
    for a, b, heal in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
            merged[-1][2] = max(merged[-1][2], b + heal)
        else:
            merged.append([a, b, b + heal])
    return merged


def validate_recovery_gaps(scenario: Any, faults: list) -> None:
    """A schedule must leave the ``recovery`` check something to look at: after every (merged)
    fault window, time for each worker's first N ops before the next window or the end."""
    opts = scenario.checks.get("recovery")
    if not faults or (opts is not None and not opts.enabled):
        return
    within = opts.within if opts is not None else 1
    ops_need = scenario.workload.recovery_gap(within)
    registry = load_registry(scenario.family)
    merged = merge_windows((f.at, latest_end(f), _heal_allowance(registry, f)) for f in faults)
    for i, (_, stop, healed) in enumerate(merged):
        nxt = merged[i + 1][0] if i + 1 < len(merged) else scenario.workload.duration
        heal = healed - stop
        need = ops_need + heal
        if nxt - stop < need:
            what = "the next fault" if i + 1 < len(merged) else "the end of the workload"
            healing = f" plus {heal:g}s its heal may take" if heal else ""
            raise ValueError(f"recovery: the fault window ending at {stop:g}s leaves {nxt - stop:g}s before {what}, "
                             f"less than the {ops_need:g}s every worker needs for {within} op(s){healing}; "
                             f"move the fault, or set checks: {{recovery: {{enabled: false}}}}")


def _heal_allowance(registry: dict, fault: Any) -> float:
    cls = registry.get(getattr(fault, "type", ""))
    return float(cls.heal_allowance(fault)) if hasattr(cls, "heal_allowance") else 0.0


def _trigger_union(family: Family):
    """``triggers:`` entries: one model per trigger the family's scenarios may name (the generic
    ones and its own, harness/triggers.py), told apart by ``type``."""
    from .triggers import registry_for

    reg = registry_for(family)
    models = []
    for name, params in sorted(reg.params.items()):
        namespace = {"__annotations__": {"type": Literal[name]},
                     "model_config": ConfigDict(extra="forbid", frozen=True),
                     "__doc__": reg.docs.get(name) or name}
        models.append(type(f"Trigger_{name}", (params,), namespace))
    known = sorted(reg.params)

    def _known_type(v: Any) -> Any:
        if isinstance(v, dict) and v.get("type") not in reg.params:
            what = f"unknown trigger type {v.get('type')!r}" if "type" in v else "missing 'type' (the trigger name)"
            raise ValueError(f"{what}; known: {', '.join(known)}")
        return v

    one = models[0] if len(models) == 1 else Annotated[Union[tuple(models)], Field(discriminator="type")]
    return Annotated[one, BeforeValidator(_known_type)]


# the tags of the two shapes of ``triggers:`` (a list, or {none: REASON}): never shown in an error's location
_TRIGGER_SHAPES = ("entries", "no_triggers")


def _triggers_field(family: Family):
    """``triggers:`` of a scenario: a list of trigger entries, or ``{none: REASON}``; None when the
    file declares nothing (refused by the scenario's validator)."""
    from .triggers import NoTriggers

    def shape(v: Any) -> str:
        return "no_triggers" if isinstance(v, (dict, NoTriggers)) else "entries"

    return Optional[Annotated[Union[Annotated[list[_trigger_union(family)], Tag("entries")],  # type: ignore[valid-type]
                                    Annotated[NoTriggers, Tag("no_triggers")]], Discriminator(shape)]]


_MODELS: dict[str, Any] = {}


def scenario_model(family: str):
    """The Scenario model of one family, built once its faults and checks are loaded."""
    if family not in _MODELS:
        fam = get_family(family)
        targets = Literal[fam.targets]  # type: ignore[valid-type]
        check_names = Literal[tuple(checks_for(fam))]  # type: ignore[valid-type]
        table = _checks_model(family, fam)
        expectation = _expectation_model(family, check_names)
        one = Union[Literal["pass"], expectation]  # type: ignore[valid-type]
        _MODELS[family] = create_model(
            f"Scenario_{family}", __base__=_ScenarioBase,
            family=(Literal[family], Field(family, description=fam.description)),  # type: ignore[valid-type]
            targets=(list[targets], Field(default_factory=lambda: list(fam.default_targets or fam.targets), min_length=1)),
            topology=(fam.Topology, Field(default_factory=fam.Topology)),
            workload=(fam.Workload, Field(default_factory=fam.Workload)),
            faults=(list[_fault_union(fam)], Field(default_factory=list)),
            triggers=(_triggers_field(fam), Field(  # type: ignore[valid-type]
                None, description="the events this scenario's claim rests on (harness/triggers.py): one that "
                "did not happen makes the run a harness error, never a verdict; `{none: REASON}` when the claim "
                "rests on no event (only a scenario without faults, e.g. a baseline); required")),
            checks=(table, Field(default_factory=table)),
            expect=(dict[targets, Annotated[Union[one, list[one]], BeforeValidator(_no_bare_failure)]], Field(
                default_factory=dict,
                description="per target the scenario runs (each must have one): `pass`, or the verdict and "
                            "the exact set of checks that fail, {verdict: fail, failing: [no_busy_wait]}; a "
                            "list when several are honest outcomes (e.g. a stall only if a request was in "
                            "flight)")),
        )
    return _MODELS[family]


def _no_bare_failure(v: Any) -> Any:
    """A bare ``fail`` or ``stall`` claims nothing about which checks fail: refused, with the fix."""
    for x in (v if isinstance(v, list) else [v]):
        if x in ("fail", "stall"):
            raise ValueError(f"a bare {x!r} does not say which checks fail: write "
                             f"{{verdict: {x}, failing: [CHECK, ...]}} (the exact set of failing checks"
                             + (", no_stall among them" if x == "stall" else "") + ")")
    return v


def _expectation_model(family: str, check_names: Any):
    def consistent(self):
        names = set(self.failing)
        if len(names) != len(self.failing):
            raise ValueError("failing names a check twice")
        both = sorted(names & set(self.may_fail))
        if both:
            raise ValueError(f"{', '.join(both)} both in failing and may_fail")
        if self.verdict == "pass" and self.may_fail:
            raise ValueError("verdict pass with may_fail: a check that fails makes the verdict fail")
        if "no_stall" in self.may_fail:
            raise ValueError("no_stall in may_fail: a stall is its own verdict; list the stall as an alternative")
        if set(self.may_fail) & set(V.ERROR_CHECKS):
            raise ValueError("may_fail names a check whose failure is a harness error")
        if self.verdict == "pass" and names:
            raise ValueError("verdict pass with failing checks: a failing check makes the verdict fail or stall")
        if self.verdict == "fail" and (not names or "no_stall" in names):
            raise ValueError("verdict fail needs failing checks, and not no_stall (that is the verdict stall)")
        if self.verdict == "stall" and "no_stall" not in names:
            raise ValueError("verdict stall: failing must include no_stall (the check whose failure is a stall)")
        bad = sorted(names & set(V.ERROR_CHECKS))
        if bad:
            raise ValueError(f"failing names {', '.join(bad)}: when it fails the run is a harness error, "
                             f"which no expectation can claim")
        return self

    return create_model(
        f"Expectation_{family}", __base__=_Strict,
        verdict=(Literal["pass", "fail", "stall"], Field(..., description="the verdict")),
        failing=(list[check_names], Field(default_factory=list,  # type: ignore[valid-type]
                                          description="exactly the checks that fail (pass: none)")),
        may_fail=(list[check_names], Field(default_factory=list,  # type: ignore[valid-type]
                                           description="checks measured to fail in some runs and hold in "
                                                       "others (say why in the description)")),
        __validators__={"consistent": model_validator(mode="after")(consistent)},
    )


def json_schema() -> dict:
    """One JSON Schema for every family's scenario files: a branch per family, selected by
    ``family`` (required in every branch), definitions shared at the
    top under a per-family prefix."""
    names = known_families()
    if len(names) == 1:
        return scenario_model(names[0]).model_json_schema(by_alias=True)
    defs: dict = {}
    branches = []
    for name in names:
        doc = scenario_model(name).model_json_schema(by_alias=True, ref_template=f"#/$defs/{name}__{{model}}")
        for key, value in doc.pop("$defs", {}).items():
            defs[f"{name}__{key}"] = value
        doc["required"] = sorted(set(doc.get("required", [])) | {"family"})
        branches.append(doc)
    return {"title": "pd-chaos scenario", "oneOf": branches, "$defs": defs}


# --------------------------------------------------------------------------- loading


class LoadedScenario:
    """A validated scenario, its family, and its whole fault schedule (random faults drawn)."""

    def __init__(self, model: Any, path: Path):
        self.model = model
        self.path = path
        self.family = get_family(model.family)
        self.faults = list(model.faults) + self._draw_random()
        if model.random_faults is not None:
            validate_recovery_gaps(model, self.faults)
            validate_faults_fit(model, self.faults)

    @property
    def name(self) -> str:
        return self.model.name

    def __getattr__(self, name: str) -> Any:  # topology, workload, targets, ... of the model
        if name.startswith("_") or name in ("model", "path", "family", "faults"):
            raise AttributeError(name)
        return getattr(self.model, name)

    def _draw_random(self) -> list:
        rf = self.model.random_faults
        if rf is None:
            return []
        rng = random.Random(self.model.seed)
        model = scenario_model(self.model.family)
        out: list[dict] = []
        slot = (rf.window[1] - rf.window[0]) / rf.count  # one fault per slot: they never overlap
        for i in range(rf.count):
            choice = dict(rng.choice(rf.choices))
            length = min(rng.uniform(*rf.length), slot * 0.8)
            at = rf.window[0] + i * slot + rng.uniform(0.0, slot - length)
            choice.update({"at": f"{at * 1000:.0f}ms", "for": f"{length * 1000:.0f}ms"})
            out.append(choice)
        drawn = TypeAdapter(model.model_fields["faults"].annotation).validate_python(out)
        for f in drawn:
            if latest_end(f) > self.model.workload.duration + 1e-9:
                raise UsageError(f"{self.path}: random_faults: a drawn fault ends after the workload; "
                                 f"narrow random_faults.window")
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
        if prev == "triggers" and part in _TRIGGER_SHAPES:
            continue  # the tag of triggers' shape (a list, or {none: REASON}): not a YAML key
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
        elif prev == "triggers" and part in _TRIGGER_SHAPES:
            continue  # the tag of triggers' shape (a list, or {none: REASON}); prev stays "triggers"
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
        return f"unknown fault type {tag!r}; known: {', '.join(sorted(err.get('_known') or load_registry()))}"
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
    if "family" not in data:
        raise UsageError(f"{path}:1: family: missing: every scenario names its system under test "
                         f"(known: {', '.join(known_families())})")
    family = data["family"]
    for i, entry in enumerate(data.get("faults") or [] if isinstance(data.get("faults"), list) else []):
        if isinstance(entry, dict) and any(isinstance(k, bool) for k in entry):
            line = _line_of(node, ("faults", i))
            raise UsageError(f"{path}:{line}: faults[{i}]: a key YAML reads as true or false (`on`, `yes`, `off`, "
                             f"...): a fault keyed on a protocol phase says `upon: {{phase: NAME, offset: 0ms}}`")
    try:
        model = scenario_model(family if isinstance(family, str) else repr(family))
    except UsageError as exc:
        line = _line_of(node, ("family",))
        raise UsageError(f"{path}:{line}: family: {exc}") from None
    try:
        scenario = model.model_validate(data)
    except ValidationError as exc:
        names = set(load_registry())
        lines = []
        for err in exc.errors():
            line = _line_of(node, err["loc"])
            where = f"{path}:{line}" if line else str(path)
            lines.append(f"{where}: {_fmt_loc(err['loc'], names)}: {_friendly({**err, '_known': load_registry(family)})}")
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


def at_concurrency(s: LoadedScenario, n: int) -> LoadedScenario:
    """The same scenario with at least ``n`` workers, its rate scaled by as much (the claim must
    hold under that load too): named ``<name>@c<n>``; unchanged when it already has ``n`` or more.
    A scenario whose workload has no concurrency and rate is refused, naming it."""
    w = s.model.workload
    c, rate = getattr(w, "concurrency", None), getattr(w, "rate", None)
    if not isinstance(c, int) or not isinstance(rate, (int, float)) or c < 1:
        raise UsageError(f"{s.path}: --concurrency: its workload has no concurrency and rate to scale")
    if c >= n:
        return s
    model = s.model.model_copy(update={"name": f"{s.name}@c{n}",
                                       "workload": w.model_copy(update={"concurrency": n, "rate": rate * n / c})})
    return LoadedScenario(model, s.path)


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

"""Node launch profiles of the pd family: where and how its vLLM servers start.

A profile says the device (``cpu`` or ``npu``), where ``vllm`` comes from (the P/D node env that
``pdchaos setup`` builds, or the ``vllm`` beside the harness's own Python, where a CI job installed
vLLM + vllm-ascend), the model, the NPU of each server, and per target the connector: its name in
``--kv-transfer-config``, its ``kv_connector_extra_config``, whether it takes a ``kv_port``, and
which protocol the P/D proxy speaks to it (``bootstrap``: vLLM's MooncakeConnector, D finds P
through P's bootstrap server; ``kv-params``: vllm-ascend's MooncakeConnectorV1, P answers first and
D gets P's ``kv_transfer_params``; ``layerwise``: vllm-ascend's decoder-first
MooncakeLayerwiseConnector, D first, D's POST to the proxy's metaserver asks P; ``store``: a KV pool,
P first, then D, no params between them). The scenarios are the same under every profile.

Built-in profiles are YAML files in ``profiles/`` beside this module (``cpu``, the default, and
``ascend``); ``--profile FILE.yaml`` reads another. ``--set KEY=VALUE`` changes one field
(``model=/models/Qwen3-0.6B``, ``devices.decode=3``, ``connectors.upstream.name=MooncakeConnector``);
the value is read as a YAML scalar. Every error names the profile and the field.
"""

from __future__ import annotations

import functools

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.errors import UsageError

HERE = Path(__file__).parent / "profiles"
DEFAULT = "cpu"


class ConnectorProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, description="kv_connector in --kv-transfer-config")
    proxy: Literal["bootstrap", "kv-params", "layerwise", "store"] = Field(
        ..., description="bootstrap: D is told P's bootstrap address and engine id (vLLM's MooncakeConnector); "
                         "kv-params: P answers first, D gets P's kv_transfer_params (vllm-ascend's MooncakeConnectorV1); "
                         "layerwise: D first, D's POST to the proxy's metaserver asks P (MooncakeLayerwiseConnector); "
                         "store: P first, then D, both through the KV pool (vLLM's MooncakeStoreConnector)")
    extra_config: dict[str, Any] = Field(
        default_factory=dict, description="kv_connector_extra_config; the vllm node fills in $KV_PORT, $KV_ROLE and "
                                          "$LOOKUP_RPC_PORT, $KV_LOAD_TIMEOUT_MS wherever they stand (families/pd/vllm_node.py)")
    kv_port: bool = Field(False, description="set kv_transfer_config.kv_port to the node's side port")
    upstream_series: str | None = Field(
        None, pattern=r"^[a-z][a-z0-9_-]*/[0-9][0-9a-z.+-]*$",
        description="PROJECT/VERSION: the node runs its installed PROJECT package with the upstream diffs of "
                    "connector_patch/upstream/PROJECT/VERSION/ applied to a copy (the patched target), no plugin")
    unavailable: str | None = Field(None, min_length=1, description="why this target cannot run under the profile "
                                    "(e.g. the connector does not support the vLLM release there): its runs are "
                                    "left out and listed with this reason, never started")


class StoreProfile(BaseModel):
    """A Mooncake store master beside P and D (AscendStore's KV pool): the topology starts it first
    (role ``store``, node ``mooncake-master``), writes the ``mooncake.json`` that
    ``MOONCAKE_CONFIG_PATH`` names for both servers, and sets ``PYTHONHASHSEED=0`` (both must hash
    blocks alike)."""
    model_config = ConfigDict(extra="forbid")
    master: str = Field("path", pattern=r"^(node-env|path|/\S+)$",
                        description="where mooncake_master comes from: node-env, path (beside this Python) or "
                                    "an absolute path")
    protocol: Literal["ascend", "tcp"] = Field("ascend", description="mooncake.json protocol")
    global_segment_size: str = Field("1GB", pattern=r"^[1-9][0-9]*GB$",
                                     description="memory each server gives the pool (1 GB aligned)")


class PDProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")
    description: str = ""
    device: Literal["cpu", "npu"]
    vllm: str = Field(..., pattern=r"^(node-env|path|/\S+)$",
                      description="node-env: the P/D node env of `pdchaos setup`; path: the `vllm` beside this "
                                  "Python; or the absolute path of a vllm command")
    model: str | None = Field(None, description="model folder, or a ModelScope id ORG/NAME found in the "
                                                "ModelScope cache (harness/ci/model.py); none: the locally "
                                                "built tiny model")
    dtype: str = Field("bfloat16", pattern=r"^(bfloat16|float16|float32|auto)$")
    max_model_len: int = Field(512, ge=64, le=131072)
    devices: dict[Literal["prefill", "decode"], str] = Field(
        default_factory=dict, description="NPU of each server (ASCEND_RT_VISIBLE_DEVICES)")
    connectors: dict[Literal["upstream", "hardened", "patched"], ConnectorProfile] = Field(
        ..., description="per target its connector; `patched` when left out: upstream's connector with the hardened "
                         "target's extra config, on the node env's vLLM with connector_patch/upstream/vllm/<its "
                         "version>/ applied (a profile whose vLLM is not the node env's names it or leaves it out)")
    env: dict[str, str] = Field(default_factory=dict, description="more environment for both servers")
    store: StoreProfile | None = Field(None, description="a Mooncake store master for a KV pool connector")
    plugin_path: str | None = Field(None, description="an absolute folder put on the hardened servers' PYTHONPATH "
                                                      "(a mutation run's plugin site: tests/mutants/system/site)")
    runtime: str = Field("local", pattern=r"^[a-z][a-z0-9_-]{0,31}$",
                         description="where the nodes run (harness/runtime.py): local processes, or the "
                                     "runtime of that name (`pdchaos list --runtimes`)")
    cluster: dict[str, Any] | None = Field(None, description="the runtime's own settings (image, namespace, "
                                                             "resources, selectors), checked by the runtime")

    @model_validator(mode="after")
    def _rules(self) -> "PDProfile":
        if self.model and not self.model.startswith(("/", ".")):  # a ModelScope id: its folder in the cache
            from harness.ci.model import resolve

            self.model = str(resolve(self.model))
        if self.device == "npu":
            if not self.model:
                raise ValueError("model: an NPU profile needs a model folder (--set model=/path/to/model)")
            if set(self.devices) != {"prefill", "decode"}:
                raise ValueError("devices: an NPU profile names the NPU of prefill and of decode")
            for role, dev in self.devices.items():
                if not dev.isdigit():
                    raise ValueError(f"devices.{role}: {dev!r} is not an NPU number")
            if self.vllm == "node-env":
                raise ValueError("vllm: node-env is the CPU node env; an NPU profile uses path")
        elif self.devices:
            raise ValueError("devices: only an NPU profile names devices")
        if self.plugin_path is not None and not (Path(self.plugin_path).is_absolute()
                                                 and Path(self.plugin_path).is_dir()):
            raise ValueError(f"plugin_path: {self.plugin_path!r} is not an absolute path of a folder")
        from harness.runtime import load_runtime

        self.cluster = load_runtime(self.runtime).settings(self.cluster)  # the runtime checks its own block
        if not {"upstream", "hardened"} <= set(self.connectors):
            raise ValueError("connectors: name the connector of both targets, upstream and hardened")
        if "patched" not in self.connectors:
            self.connectors["patched"] = derived_patched(self)
        for key in self.env:
            if not key.replace("_", "").isalnum() or key[0].isdigit():
                raise ValueError(f"env: {key!r} is not an environment variable name")
        return self

    def key(self) -> tuple:
        """What a warm node's start settings depend on (harness/pool.py)."""
        return (self.name, self.runtime, self.device, self.vllm, self.model, self.dtype, self.max_model_len,
                tuple(sorted(self.devices.items())), tuple(sorted(self.env.items())),
                self.store.model_dump_json() if self.store else None, self.plugin_path)


def derived_patched(prof: "PDProfile") -> ConnectorProfile:
    """The patched target's connector when a profile does not name one: upstream's connector, by its
    upstream name, with the hardened target's settings, on the node env's vLLM with the upstream diffs
    of its release applied (connector_patch/upstream/README.md). Elsewhere (a vLLM the harness did not
    install) unavailable, with the reason."""
    up, hard = prof.connectors["upstream"], prof.connectors["hardened"]
    why = None
    if prof.vllm != "node-env":
        why = ("the patched target copies the node env's vLLM and applies the upstream diffs to it; this profile's "
               "vLLM is another installation: name connectors.patched with its upstream_series to run it")
    elif up.unavailable:
        why = up.unavailable
    from stacks.vllm_cpu.recipe import VLLM_VERSION

    return ConnectorProfile(name=up.name, proxy=hard.proxy, extra_config=dict(hard.extra_config),
                            kv_port=hard.kv_port, upstream_series=f"vllm/{VLLM_VERSION}", unavailable=why)


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def _apply_set(data: dict, item: str, where: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. model=/models/Qwen3-0.6B")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, (dict, list)):
        raise UsageError(f"--set {key}: give one value, not a mapping or a list")
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise UsageError(f"--set {key}: {part!r} of {where} is not a mapping")
        node = nxt
    if isinstance(node.get(parts[-1]), str) or parts[0] in ("devices", "env", "model"):
        value = raw  # a text field keeps the text as given ("3" stays "3")
    node[parts[-1]] = value


def load_profile(spec: str | None, sets: list[str] | tuple[str, ...] = ()) -> PDProfile:
    """The profile named ``spec`` (a built-in name or a YAML file), with ``sets`` applied."""
    spec = spec or DEFAULT
    path = Path(spec)
    if not spec.endswith((".yaml", ".yml")):
        if spec not in builtin_profiles():
            raise UsageError(f"--profile {spec!r}: no such profile of family pd; built in: "
                             f"{', '.join(builtin_profiles())} (or give a .yaml file)")
        path = HERE / f"{spec}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--profile {spec}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--profile {spec}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--profile {spec}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--profile {spec}: a profile is a mapping (name, device, vllm, connectors, ...)")
    for item in sets:
        _apply_set(data, item, f"profile {spec}")
    try:
        return PDProfile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise UsageError(f"--profile {spec}: {loc + ': ' if loc else ''}{msg}") from None


@functools.lru_cache(maxsize=1)
def default_profile() -> PDProfile:
    """The default launch profile, read once: the plan asks for it per scenario and target when
    no ``--profile`` was given (profiles are never changed once loaded)."""
    return load_profile(None)


STORE_DEFAULT = "cpu-store"


@functools.lru_cache(maxsize=1)
def _store_default() -> PDProfile:
    return load_profile(STORE_DEFAULT)


def profile_for(scenario: Any, profile: PDProfile | None = None) -> PDProfile:
    """The launch profile a scenario runs under: the one given (``--profile``), else the default;
    a scenario with a KV pool (``topology.kv_pool``) needs a store master, so without ``--profile``
    it runs under ``cpu-store`` (the default's stack with vLLM's store connector and a master)."""
    if profile is not None:
        return profile
    prof = default_profile()
    if getattr(scenario.topology, "kv_pool", False) and prof.store is None:
        return _store_default()
    return prof


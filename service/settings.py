"""Service configuration, read from ``RLSERVE_*`` environment variables.

Every knob is validated when ``Settings`` is built, so a typo fails at start with a
message naming the valid choices instead of surfacing on the first request. That includes
the variable names: an ``RLSERVE_*`` variable that is no setting (``RLSERVE_MAX_BATCH_SIZ``)
stops the start with the closest setting's name, unless it is one of ``NOT_SETTINGS``.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from rlserve.models.export.archive import MAX_UNPACKED_BYTES
from rlserve.models.multiagent.mapping import AgentMapping, MappingError
from rlserve.service.device_request import DeviceRequest

PREFIX = "RLSERVE_"
# RLSERVE_* variables that are not server settings, so a shell that exports them can still
# start the server (never taken for misspelt settings). A new one belongs here and in the
# README; tests/unit/test_documented_variables.py checks that every RLSERVE_* name in the
# docs is a setting or one of these.
# Read by clients: the docs ask users to export them for the examples.
CLIENT_VARIABLES = {
    "RLSERVE_URL": "the HTTP address rlserve demo, docker/load_model.sh and the docs' client examples use",
    "RLSERVE_GRPC_URL": "the gRPC address the docs' tritonclient.grpc example uses (docs/api.md)",
}
# Read by the project's other tools.
TOOL_VARIABLES = {
    "RLSERVE_GPU_PORT": "the GPU service's host port in docker/compose.yaml",
    "RLSERVE_LB_PORT": "the load balancer's host port in docker/compose.yaml",
    "RLSERVE_ORACLE_DIR": "the RLlib fixtures the tests compare with",
    "RLSERVE_CHECKPOINT_DIR": "the RLlib checkpoints the tests compare with",
    "RLSERVE_NEWSTACK_DIR": "the RLlib new-API-stack checkpoints the tests compare with",
    "RLSERVE_CUSTOM_MODULES_DIR": "the RLlib checkpoints of custom RLModule classes the tests trace and compare with",
    "RLSERVE_RAY_PYTHON": "an interpreter with ray and rlserve the --trust-code tests export with",
    "RLSERVE_RAY_VENV": "where the --trust-code tests make their environment with ray",
    "RLSERVE_OPENPI_PYTHON": "an interpreter with openpi-client the openpi route's tests run it with",
    "RLSERVE_TEST_CPU_LOG": "where the tests log each test's CPU (tests/cpu_log.py)",
    "RLSERVE_OPENPI_VENV": "where the openpi route's tests make their environment with openpi-client",
    "RLSERVE_CI_PYTHON": "the interpreter .ci/run builds its environment with",
    "RLSERVE_FUZZ_SEED": "the seed the tests' multi-agent fuzzer replays instead of a fresh one",
    "RLSERVE_CI_VENV": "where .ci/run builds its environment",
}
NOT_SETTINGS = {**CLIENT_VARIABLES, **TOOL_VARIABLES}

RuntimeName = Literal["auto", "onnx", "torchscript"]
SessionCache = Literal["validate", "trust"]
_STORE_SCHEMES = ("redis", "rediss", "unix")
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
AccessLog = Literal["off", "refused", "all"]
AccessLogFormat = Literal["text", "json"]


class Settings(BaseSettings):
    """All server settings; ``RLSERVE_<FIELD>`` overrides each one."""

    model_config = SettingsConfigDict(env_prefix="RLSERVE_", extra="forbid", frozen=True)

    # Where bundles live. None serves the embedded defaults in service/default_models/
    # (unless checkpoints are given: then only they are served).
    repository: Path | None = None
    # RLlib checkpoint directories to export at start and serve, as "PATH" or "NAME=PATH"
    # (JSON list in the environment); needs torch unless the export is cached.
    checkpoints: list[str] = []
    # Where checkpoint exports are kept between starts (serving/export_cache.py). None:
    # $XDG_CACHE_HOME/rlserve/exports, else ~/.cache/rlserve/exports.
    export_cache: Path | None = None
    # Policy sets (multi-agent) to serve at start, as "[NAME=]DIR" (JSON list in the
    # environment): a set directory (`rlserve export ... --mapping FILE`), or a multi-policy
    # RLlib checkpoint, exported at start with agent_mapping (needs torch).
    policy_sets: list[str] = []
    # The agent-to-policy mapping of the policy sets above (JSON: {"agents": {"player_0":
    # "p0"}, "patterns": [["red_*", "p0"]], "default": "p1"}); replaces a set's own mapping.
    agent_mapping: dict[str, Any] | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    # The Open Inference Protocol's gRPC service on this port too (None: off; 0 picks a free
    # one). Needs the [grpc] extra; every worker of --workers listens on it (SO_REUSEPORT).
    grpc_port: int | None = Field(None, ge=0, le=65535)
    # The admin API is disabled unless a token is set; there is deliberately no default.
    admin_token: str | None = None

    # Dynamic batching: a batch closes at max_batch_size rows or max_batch_delay_ms after
    # its first request arrived, whichever comes first (0 = take what is queued now).
    max_batch_size: int = Field(1024, ge=1)  # 64-observation requests: 16 per call
    max_batch_delay_ms: float = Field(0.0, ge=0.0)
    batching: bool = True  # False runs every request as its own runtime call
    queue_limit: int = Field(4096, ge=1)  # pending rows per model version before 503
    retry_after_s: int = Field(1, ge=0)
    # Batches with more rows than this run in a worker thread so the event loop keeps
    # parsing requests meanwhile. On 2 vCPUs shared with clients the thread costs more than
    # it overlaps (64-obs requests: ~+20-40% obs/s with every batch inline, docs/benchmarks.md),
    # so by default only batches larger than max_batch_size (one huge request) leave the loop.
    inline_batch_rows: int = Field(1024, ge=0)

    session_idle_ttl_s: float = Field(600.0, gt=0.0)
    max_sessions: int = Field(10_000, ge=1)  # per model version; the least recently used goes
    initial_session_slots: int = Field(64, ge=1)
    session_tombstones: int = Field(100_000, ge=0)  # remembered expired ids (410 vs 404)
    # Where sessions live: None keeps them in this process; redis://host:port/db,
    # rediss://... or unix:///path/to/redis.sock puts them in Redis or Valkey, shared by
    # every worker and replica (docs/sessions.md). max_sessions then bounds the copies
    # each process caches, not the sessions.
    session_store: str | None = None
    session_store_prefix: str = Field("rlserve", min_length=1)
    session_store_timeout_s: float = Field(2.0, gt=0.0)
    # validate: before each batch one script checks the cached copies are the store's
    # latest (any replica may step any session); trust: skip that read when the load
    # balancer routes each session to one replica (a stale copy still fails with 409).
    session_cache: SessionCache = "validate"

    # Processes serving one port (each loads the models; sessions then need session_store).
    workers: int = Field(1, ge=1)
    # On SIGTERM: report not ready (/readyz 503) but keep serving this long, so a load
    # balancer stops sending, then stop accepting, answer what is in flight, exit.
    shutdown_drain_s: float = Field(0.0, ge=0.0)
    # Replicas sharing one repository: look for new bundles this often (0: never) and
    # write uploaded archives into the repository so the others load them too.
    repository_poll_s: float = Field(0.0, ge=0.0)

    runtime: RuntimeName = "auto"  # auto: the bundle's ONNX file if present, else TorchScript
    intra_op_threads: int = Field(1, ge=0)  # 0 lets ONNX Runtime / torch choose
    # ONNX Runtime's other intra-op threads spin between and after calls by default; a server
    # shares its cores with the event loop (and often its clients), so here they sleep.
    intra_op_spinning: bool = False
    # auto: CUDA when the runtime can use it (else the CPU, and the log says why); cpu;
    # cuda or cuda:N: CUDA device N or the bundle is refused (docs/api.md).
    device: str = "auto"
    # ONNX Runtime's TensorRT provider ahead of CUDA's, where the installed build has it.
    onnx_tensorrt: bool = False
    # ONNX Runtime on CUDA: integer inputs of float model inputs (uint8 frames) are copied to
    # the device narrow and cast there; false casts them on the host, into the staging block.
    onnx_device_cast: bool = True
    default_explore: bool | None = None  # None: each bundle's own 'explore' setting
    verify_on_load: bool = True  # run the bundle's reference inputs before serving it

    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    # Rows one request may carry, in any form (JSON list, binary block, Open Inference
    # Protocol tensors): a declared shape is held to it before anything is allocated.
    max_rows: int = Field(65536, ge=1)
    # The most bytes one .rlsb archive (uploaded or in the repository) may unpack to.
    max_unpacked_bytes: int = Field(MAX_UNPACKED_BYTES, ge=1)
    fast_act_path: bool = True  # serve /act through the raw ASGI handler
    # With fast_act_path, `rlserve serve` answers /act inside uvicorn's HTTP protocol,
    # without an ASGI task per request (service/act_protocol.py); False keeps it on ASGI.
    act_protocol: bool = True
    # Streams (WebSocket, /v1/models/{name}/stream; docs/api.md "Streams"): the open streams
    # one process serves (0: upgrades refused), the unanswered steps one stream may have
    # (past that the server stops reading it), and the unreadable messages after which a
    # stream is closed (1008). A message is held to max_body_bytes like a body.
    stream_max_connections: int = Field(1024, ge=0)
    stream_max_inflight: int = Field(16, ge=1, le=4096)
    stream_max_unreadable: int = Field(8, ge=1)
    # openpi's policy-server protocol on "/" for this model (what `WebsocketClientPolicy(host,
    # port)` connects to); /v1/models/{name}/openpi serves it for every model either way.
    openpi_model: str | None = None
    log_level: LogLevel = "info"
    # One line per request (service/access_log.py): refused (default) logs the answers with
    # a status >= 400 only, all every answer, off none; the format is text or JSON lines.
    access_log: AccessLog = "refused"
    access_log_format: AccessLogFormat = "text"

    # The experience log (docs/experience.md): what was served, written as training data in
    # RLlib's offline Parquet forms under this folder (None: off; needs the [experience] extra).
    experience_log: Path | None = None
    # The fraction of episodes logged (drawn per episode) of every model; experience_models
    # (JSON {"model": fraction}), when not empty, logs only the models it names, each at its own.
    experience_sample: float = Field(1.0, ge=0.0, le=1.0)
    experience_models: dict[str, float] = {}
    experience_queue_rows: int = Field(65536, ge=1)  # transitions waiting for the writer, then dropped
    experience_roll_s: float = Field(60.0, gt=0.0)  # the longest a row waits in memory for its file
    experience_roll_bytes: int = Field(64 * 1024 * 1024, ge=1024)  # or this many bytes
    experience_flush_s: float = Field(1.0, ge=0.0)  # what waits (transitions, ended episodes) is written this soon
    # Shadows started once the models are loaded (docs/api.md, "Shadow"): JSON
    # {"live model": {"candidate": "model[@version]", "version"?: "live version", "queue_rows"?: N}}.
    shadow: dict[str, dict[str, Any]] = {}

    # A traffic split per model between its versions (docs/rollout.md; JSON {"model":
    # {"version": weight}}), applied when every version it names is loaded; the admin API
    # changes it later. canary_guard (JSON {"margin": return, "min_episodes": n}) rolls a
    # canary back when its mean return falls below the baseline's by more than margin.
    canary: dict[str, dict[str, float]] = {}
    canary_guard: dict[str, float] | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Before any value is read: the environment holds no RLSERVE_* name that is no setting.
        check_environment(os.environ)
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        return str(DeviceRequest.parse(value))  # "cuda" is "cuda:0"

    @field_validator("repository", "export_cache")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().resolve()

    @field_validator("session_store")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        scheme = value.partition("://")[0].lower()
        if "://" not in value or scheme not in _STORE_SCHEMES:
            raise ValueError(f"a Redis/Valkey URL starting with one of {[s + '://' for s in _STORE_SCHEMES]}, "
                             "e.g. redis://localhost:6379/0 or unix:///run/redis.sock")
        # The client library ([redis] extra) and the store's answer are checked at start
        # (service/startup.py), where a refusal can say how to install it.
        return value

    @field_validator("agent_mapping")
    @classmethod
    def _mapping(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            try:
                AgentMapping.from_json(value)
            except MappingError as exc:
                raise ValueError(str(exc)) from exc
        return value

    @field_validator("experience_log")
    @classmethod
    def _experience_folder(cls, value: Path | None) -> Path | None:
        # pyarrow missing is the start-up check's refusal (service/startup.py), as for every extra.
        if value is None or not str(value):
            return None
        return value.expanduser().resolve()

    @field_validator("experience_models")
    @classmethod
    def _fractions(cls, value: dict[str, float]) -> dict[str, float]:
        for name, fraction in value.items():
            if not 0.0 <= fraction <= 1.0:
                raise ValueError(f"a fraction of episodes in [0, 1] for each model, {name!r}: {fraction}")
        return value

    @field_validator("canary")
    @classmethod
    def _weights(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for name, weights in value.items():
            if not weights or any(not math.isfinite(w) or w < 0 for w in weights.values()) \
                    or not sum(weights.values()) > 0:
                raise ValueError(f"model {name!r}: weights are finite numbers >= 0 with a positive sum, "
                                 f"e.g. {{\"1\": 90, \"2\": 10}}; got {weights}")
        return value

    @field_validator("canary_guard")
    @classmethod
    def _guard(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        margin, episodes = value.get("margin"), value.get("min_episodes")
        if set(value) != {"margin", "min_episodes"} or margin is None or not math.isfinite(margin) or margin < 0 \
                or episodes is None or episodes != int(episodes) or not 1 <= episodes <= 1e9:
            raise ValueError("{\"margin\": a return difference >= 0, \"min_episodes\": an integer >= 1}; "
                             f"got {value}")
        return value

    @field_validator("shadow")
    @classmethod
    def _shadows(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, shadow in value.items():
            unknown = sorted(set(shadow) - {"candidate", "version", "queue_rows"})
            candidate, rows = shadow.get("candidate"), shadow.get("queue_rows", 1)
            if unknown or not isinstance(candidate, str) or not candidate:
                raise ValueError(f"{name!r}: an object with 'candidate' (\"model\" or \"model@version\") and "
                                 f"optionally 'version' and 'queue_rows'; received {shadow!r}")
            if not isinstance(shadow.get("version", ""), str) or not isinstance(rows, int) or rows < 1:
                raise ValueError(f"{name!r}: 'version' a string and 'queue_rows' an integer >= 1; received {shadow!r}")
        return value

    @field_validator("admin_token")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        # An empty variable means "not set", never "the empty password".
        return value or None


class UnknownSetting(ValueError):
    """An ``RLSERVE_*`` environment variable names no setting (a typo, or a removed one)."""


def check_environment(environ: Mapping[str, str]) -> None:
    """Raise ``UnknownSetting`` naming every ``RLSERVE_*`` variable of ``environ`` that is
    neither a setting nor one of ``NOT_SETTINGS``, each with the closest setting's name.

    Names compare case-insensitively, as pydantic-settings reads them.
    """
    settings = {PREFIX + name.upper() for name in Settings.model_fields}
    unknown = sorted(key for key in environ
                     if key.upper().startswith(PREFIX) and key.upper() not in settings | NOT_SETTINGS.keys())
    if unknown:
        raise UnknownSetting("\n".join(_unknown_setting(key, settings) for key in unknown))


def _unknown_setting(key: str, settings: set[str]) -> str:
    typed, names = key.upper()[len(PREFIX):], sorted(name[len(PREFIX):] for name in settings)
    # A near spelling (MAX_BATCH_SIZ), else a shortened name inside one (REPO, TOKEN), else
    # a looser spelling.
    close = (difflib.get_close_matches(typed, names, n=1, cutoff=0.75)
             or sorted((n for n in names if len(typed) >= 3 and typed in n), key=len)[:1]
             or difflib.get_close_matches(typed, names, n=1, cutoff=0.6))
    hint = (f"did you mean {PREFIX}{close[0]}?" if close
            else f"no setting has a similar name; the settings are {', '.join(sorted(settings))}")
    return f"unknown setting {key} in the environment: {hint}"

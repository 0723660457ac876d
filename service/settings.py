"""Service configuration, read from ``RLSERVE_*`` environment variables.

Every knob is validated when ``Settings`` is built, so a typo fails at start with a
message naming the valid choices instead of surfacing on the first request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

RuntimeName = Literal["auto", "onnx", "torchscript"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class Settings(BaseSettings):
    """All server settings; ``RLSERVE_<FIELD>`` overrides each one."""

    model_config = SettingsConfigDict(env_prefix="RLSERVE_", extra="forbid", frozen=True)

    # Where bundles live. None serves the embedded defaults in service/default_models/
    # (unless checkpoints are given).
    repository: Path | None = None
    # RLlib checkpoint directories to export at start and serve, as "PATH" or "NAME=PATH"
    # (JSON list in the environment); needs torch.
    checkpoints: list[str] = []
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
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

    runtime: RuntimeName = "auto"  # auto: the bundle's ONNX file if present, else TorchScript
    intra_op_threads: int = Field(1, ge=0)  # 0 lets ONNX Runtime / torch choose
    use_gpu: bool = True  # use CUDA when the runtime offers it
    default_explore: bool | None = None  # None: each bundle's own 'explore' setting
    verify_on_load: bool = True  # run the bundle's reference inputs before serving it

    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    fast_act_path: bool = True  # serve /act through the raw ASGI handler
    # With fast_act_path, `rlserve serve` answers /act inside uvicorn's HTTP protocol,
    # without an ASGI task per request (service/act_protocol.py); False keeps it on ASGI.
    act_protocol: bool = True
    log_level: LogLevel = "info"

    @field_validator("repository")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().resolve()

    @field_validator("admin_token")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        # An empty variable means "not set", never "the empty password".
        return value or None

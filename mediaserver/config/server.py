"""Settings of the server itself: where it listens, who may use it, input limits, GPU gating, the rest."""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator


class ServerSettings(BaseModel):
    """Network, auth, input limits, GPU capability gating and process-wide knobs (part of ``Settings``)."""

    # --- network -------------------------------------------------------------------------------
    host: str = Field("0.0.0.0", description="the address HTTP and HTTPS listen on")
    http_port: int = Field(19001, ge=0, le=65535, description="the HTTP port")
    http_max_line_bytes: int = Field(
        65536,
        ge=8190,
        description="the longest HTTP request line accepted: Willow's GET /api/tts carries the text in the URL, "
        "and a text within tts_max_input_chars, percent-encoded, can pass aiohttp's 8190 (a 9000-byte URL got its "
        "plain-text 400, a trial); longer lines still get a 400",
    )
    http_keepalive_timeout_s: float = Field(
        75.0,
        gt=0,
        description="an HTTP connection with no request in progress (idle between requests, or whose request's "
        "headers have not all come) is closed after this long (aiohttp's own default is an hour: a trial's "
        "half-sent requests held their sockets past two minutes)",
    )
    https_port: int = Field(
        19000, ge=0, le=65535, description="the HTTPS port, served only when `cert_dir` has `cert.pem` and `key.pem`"
    )
    cert_dir: Path = Field(
        Path("certs"),
        description="the TLS certificate and key, `cert.pem` and `key.pem` (`python tools/gen_cert.py` writes them)",
    )
    static_dir: Path = Field(
        Path(__file__).resolve().parents[2] / "static",
        description="the web pages, served at `/static/` (and its `rtc/` at `/rtc/`)",
    )

    # --- auth (all optional; Willow devices can only send Basic auth through user:pass@ URLs) ---
    basic_auth_user: str | None = Field(
        None,
        description="HTTP Basic auth, with `basic_auth_password` (Willow devices send it from a "
        "`https://user:pass@host` URL)",
    )
    basic_auth_password: str | None = Field(None, description="the password of `basic_auth_user`")
    api_keys: list[str] = Field(
        default_factory=list, description="API keys accepted as `X-API-Key` or `Authorization: Bearer` (a JSON list)"
    )
    cors_allow_origins: list[str] = Field(
        default_factory=list,
        description="web origins whose pages may call the HTTP API from the browser (CORS, as OpenAI's API "
        'allows: a page that POSTs its WebRTC offer to /v1/realtime/calls); `["*"]` = any; empty (the '
        "default) = only the server's own pages. Browsers apply no CORS to WebSockets: a WebSocket from a page of "
        "another origin is refused (403) unless it is listed here or sends an API key or a client secret (not Basic "
        "credentials, which a browser sends by itself)",
    )

    # --- input limits --------------------------------------------------------------------------
    max_upload_bytes: int = Field(100 * 1024 * 1024, ge=1024, description="the largest upload; a 413 past it")
    max_audio_duration_s: float = Field(3 * 3600.0, gt=0, description="the longest audio of one request; a 413 past it")
    body_read_timeout_s: float = Field(60.0, gt=0, description="an upload that stalls this long is a 408")

    # --- features on a GPU (capability gating; on the CPU every installed feature is on) ---------
    vram_asr_mb: int = Field(1500, ge=0, description="VRAM the ASR models need before ASR is enabled")
    vram_tts_mb: int = Field(500, ge=0, description="VRAM TTS needs, taken after ASR's")
    vram_llm_mb: int = Field(4000, ge=0, description="VRAM the LLM needs, taken after ASR's and TTS's")

    # --- misc ----------------------------------------------------------------------------------
    malloc_arena_max: int = Field(
        2, ge=0, description="glibc malloc arenas (as MALLOC_ARENA_MAX); fewer keep RSS down; 0 = glibc's default"
    )
    ffmpeg_threads: int = Field(
        1,
        ge=0,
        description="cores FFmpeg (PyAV, aiortc) sizes its thread pools for: 1 starts no threads per stream's "
        "audio conversion or encoder; 0 = FFmpeg's default, one per core",
    )
    retry_after_fallback_s: float = Field(
        5.0, gt=0, description="Retry-After of a transient 503 the server cannot estimate (session cap, shutdown)"
    )
    shutdown_grace_s: float = Field(
        7.0,
        ge=0,
        description="on SIGTERM/SIGINT, how long HTTP requests still running (a streamed chat answer) may finish "
        "before they are cancelled (streaming sessions and Wyoming connections are closed at once). Stopping the "
        "engine and models takes 1-2 s more (measured on 2 loaded cores; an engine that does not exit is killed after "
        "llm_engine_stop_timeout_s): 7 s keeps the whole stop inside Docker's default 10 s",
    )
    save_audio_dir: Path = Field(
        Path("audio"), description="where Willow's `save_audio` writes `willow.wav`, served at `/audio/willow.wav`"
    )
    allow_save_audio: bool = Field(True, description="whether Willow's `save_audio` is honoured")
    log_level: str = Field("INFO", description="the logging level (`DEBUG`, `INFO`, `WARNING` ...)")

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        level = value.strip().upper()
        if not isinstance(logging.getLevelName(level), int):
            raise ValueError(f"log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {value!r}")
        return level

    @field_validator("api_keys")
    @classmethod
    def _api_keys(cls, value: list[str]) -> list[str]:
        if any(not key.strip() for key in value):
            raise ValueError("api_keys has an empty key: every key must be non-empty (an empty list turns keys off)")
        return value

    @model_validator(mode="after")
    def _basic_auth_pair(self) -> ServerSettings:
        # Half a pair would fail open: a password without a user turned auth off, a user without a
        # password took any client's empty password (an operator trial: a missing secret, no warning).
        user, password = self.basic_auth_user, self.basic_auth_password
        if (user is None) != (password is None):
            given, missing = ("basic_auth_user", "basic_auth_password") if password is None else (
                "basic_auth_password", "basic_auth_user"
            )  # fmt: skip
            raise ValueError(f"{given} is set but {missing} is not: HTTP Basic auth needs both (or neither)")
        if user is not None and (not user.strip() or not (password or "").strip()):
            raise ValueError("basic_auth_user and basic_auth_password must not be empty")
        return self

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys) or self.basic_auth_user is not None

    def cert_paths(self) -> tuple[Path, Path]:
        return self.cert_dir / "cert.pem", self.cert_dir / "key.pem"

"""Settings: every limit, timeout and default of the server, in one typed place.

Each field can be set from the environment as ``MEDIASERVER_<FIELD>`` (case-insensitive) or from a
``.env`` file in the working directory. Units are part of the names so a value can be read without
looking up the code (``max_upload_bytes``, ``asr_max_wait_ms``).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL_ALIASES: dict[str, str] = {
    # OpenAI model names map to the default model: SDK users keep their code unchanged. Only names
    # whose job the default model does: gpt-4o-transcribe-diarize is left out (nothing diarizes).
    "whisper-1": "@default",
    "gpt-4o-transcribe": "@default",
    "gpt-4o-mini-transcribe": "@default",
    "gpt-transcribe": "@default",
    "gpt-4o-mini-transcribe-2025-12-15": "@default",
    "gpt-live-transcribe": "@default",
    "gpt-realtime-whisper": "@default",
}

# Voice names clients already send: OpenAI's built-in voices and WIS's speakers (SpeechT5 x-vectors,
# XTTS's shipped voices). "@default" means tts_default_voice.
OPENAI_VOICES = ["alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse"]
OPENAI_VOICES += ["marin", "cedar"]
WIS_SPEAKERS = ["AWB", "BDL", "CLB", "KSP", "RMS", "SLT", "default", "female", "male"]
DEFAULT_VOICE_ALIASES: dict[str, str] = {name: "@default" for name in OPENAI_VOICES + WIS_SPEAKERS}
PIPER_VOICE_URL = (
    "https://huggingface.co/rhasspy/piper-voices/resolve/main/{lang_family}/{lang_code}/{voice_name}/"
    "{voice_quality}/{lang_code}-{voice_name}-{voice_quality}{extension}?download=true"
)


# OpenAI chat and embedding model names map to the default LLM / embedding model.
DEFAULT_LLM_ALIASES: dict[str, str] = {
    name: "@default"
    for name in ("gpt-4o-mini", "gpt-4o", "gpt-4.1-mini", "gpt-4.1", "gpt-3.5-turbo", "gpt-4", "gpt-5-mini", "gpt-5")
}
DEFAULT_EMBEDDING_ALIASES: dict[str, str] = {
    name: "@embedding" for name in ("text-embedding-3-small", "text-embedding-3-large", "text-embedding-ada-002")
}


class RemoteModel(BaseModel):
    """A model served by a remote ASR engine instead of a local CTranslate2 copy (``remote_models``).

    ``backend`` ``openai``: any OpenAI-compatible ``/v1/audio/transcriptions`` (vLLM, speaches,
    another mediaserver); ``url`` is its base URL up to and including ``/v1``. ``triton``: NVIDIA
    Triton's KServe v2 protocol; ``url`` is ``grpc://host:8001`` or ``http://host:8000``, and
    ``model`` names the Triton model with the TensorRT-LLM Whisper example's ``infer_bls`` tensors.
    """

    model_config = {"extra": "forbid"}

    backend: Literal["openai", "triton"]
    url: str
    model: str = Field("", description="upstream model name; empty = whisper-1 (openai) or infer_bls (triton)")
    api_key: SecretStr | None = Field(None, description="openai: sent as a Bearer token")
    multilingual: bool = Field(True, description="whether the upstream model transcribes other languages")
    timeout_s: float = Field(60.0, gt=0, description="one upstream request; a 504 naming the backend past it")
    connect_timeout_s: float = Field(5.0, gt=0)
    retries: int = Field(2, ge=0, le=10, description="retries after a connection error (never after a sent request)")
    retry_backoff_ms: float = Field(200.0, ge=0)
    max_concurrency: int = Field(8, ge=1, le=1024, description="upstream requests in flight at once")
    probe_interval_s: float = Field(10.0, gt=0, description="how often /health's view of the backend is refreshed")
    response_format: Literal["verbose_json", "json"] = Field(
        "verbose_json", description="openai: verbose_json brings language and segments; json is the widest support"
    )
    triton_batching: Literal["request", "concurrent"] = Field(
        "request", description="triton: a scheduler batch as one request of N rows, or N requests at once"
    )
    triton_max_batch: int = Field(8, ge=1, description="triton: rows per request (the model's max_batch_size)")
    triton_pad_s: float = Field(
        30.0, ge=0, le=30, description="triton concurrent mode: pad each WAV to this length so Triton can batch them"
    )
    max_new_tokens: int = Field(224, ge=1, le=448, description="triton: MAX_NEW_TOKENS per 30 s window")


# --- MCP servers (function calling, mediaserver/assistant/mcp.py) ---
class McpServerConfig(BaseModel):
    """An MCP server whose tools the assistant may call (``mcp_servers``): a URL or a command.

    ``url``: streamable HTTP (``transport: "http"``, what Home Assistant's MCP Server integration
    serves at ``/api/mcp``) or legacy SSE (``transport: "sse"``), with ``headers`` on every request
    (``{"Authorization": "Bearer <long-lived token>"}``). ``command`` + ``args``: a stdio server, a
    child process of mediaserver.
    """

    model_config = {"extra": "forbid"}

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$", description="names the server in logs and metrics")
    url: str | None = None
    transport: Literal["http", "sse"] = "http"
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    allowed_tools: list[str] | None = Field(None, description="offer only these of the server's tools")

    @model_validator(mode="after")
    def _one_way(self) -> McpServerConfig:
        if (self.url is None) == (self.command is None):
            raise ValueError(f"MCP server {self.name!r}: give either url or command")
        return self


# --- end MCP servers ---


def _renamed(name: str, old: str) -> AliasChoices:
    """A setting that was renamed: read from ``MEDIASERVER_<NAME>``, or else from the variable of its
    old name (``MEDIASERVER_<OLD>``), so deployments configured before the rename keep working."""
    return AliasChoices(f"mediaserver_{name}", f"mediaserver_{old}")


class GenerationDefaults(BaseModel):
    """A model's sampling defaults (``llm_generation_defaults``); unset fields keep the built-in or global ones."""

    model_config = {"extra": "forbid"}

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    repeat_penalty: float | None = Field(None, ge=0.5, le=2.0, description="llama.cpp engines only; 1 = off")
    dry_multiplier: float | None = Field(
        None, ge=0, le=5, description="llama.cpp's DRY penalty on repeated sequences (runaway loops); 0 = off"
    )


class Settings(BaseSettings):
    """All configuration; see README "Configuration" for the environment variable names."""

    # validate_by_name: Settings(asr_default_model=...) by field name, next to the renamed settings'
    # environment aliases (_renamed).
    model_config = SettingsConfigDict(
        env_prefix="MEDIASERVER_", env_file=".env", extra="ignore", validate_by_name=True, validate_by_alias=True
    )

    # --- network -------------------------------------------------------------------------------
    host: str = "0.0.0.0"
    http_port: int = Field(19001, ge=0, le=65535)
    https_port: int = Field(19000, ge=0, le=65535)
    cert_dir: Path = Path("certs")
    static_dir: Path = Path(__file__).resolve().parent.parent / "static"

    # --- auth (all optional; Willow devices can only send Basic auth through user:pass@ URLs) ---
    basic_auth_user: str | None = None
    basic_auth_password: str | None = None
    api_keys: list[str] = Field(default_factory=list)

    # --- models --------------------------------------------------------------------------------
    asr_default_model: str = Field("tiny.en", validation_alias=_renamed("asr_default_model", "default_model"))
    translation_model: str = "base"
    asr_preload_models: list[str] = Field(
        default_factory=lambda: ["tiny.en"], validation_alias=_renamed("asr_preload_models", "preload_models")
    )
    asr_extra_models: dict[str, str] = Field(
        default_factory=dict,
        description="name -> local CTranslate2 directory or Hugging Face repo id",
        validation_alias=_renamed("asr_extra_models", "extra_models"),
    )
    remote_models: dict[str, RemoteModel] = Field(
        default_factory=dict,
        description="name -> a remote ASR engine (Triton or OpenAI-compatible); wins over a local model of that name",
    )
    asr_model_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_MODEL_ALIASES),
        validation_alias=_renamed("asr_model_aliases", "model_aliases"),
    )
    wis_size_fallback: bool = True
    allow_model_download: bool = True
    model_cache_dir: Path = Path.home() / ".cache" / "mediaserver" / "models"
    max_loaded_models: int = Field(4, ge=1)

    # --- device --------------------------------------------------------------------------------
    device: Literal["auto", "cpu", "cuda"] = "auto"
    compute_type: str = "auto"
    cpu_threads: int = Field(0, ge=0, description="0 = one per core")

    # --- decoding defaults ---------------------------------------------------------------------
    default_language: str = "en"
    default_beam_size: int = Field(1, ge=1, le=10)
    max_beam_size: int = Field(10, ge=1)

    # --- input limits --------------------------------------------------------------------------
    max_upload_bytes: int = Field(100 * 1024 * 1024, ge=1024)
    max_audio_duration_s: float = Field(3 * 3600.0, gt=0)
    body_read_timeout_s: float = Field(60.0, gt=0)

    # --- VAD gate ------------------------------------------------------------------------------
    vad_aggressiveness: int = Field(2, ge=0, le=3)
    vad_frame_ms: Literal[10, 20, 30] = 30
    vad_min_speech_ms: int = Field(120, ge=0)
    asr_vad_filter: bool = True

    # --- ASR scheduler -------------------------------------------------------------------------
    asr_max_batch: int = Field(8, ge=1)
    asr_max_wait_ms: float = Field(5.0, ge=0, description="close a batch when no job arrived for this long")
    asr_max_collect_ms: float = Field(50.0, ge=0, description="close a batch after collecting this long in all")
    asr_max_queue: int = Field(64, ge=1)
    asr_request_timeout_s: float = Field(300.0, gt=0)
    asr_batching: bool = True
    asr_pack_windows: bool = True
    asr_pack_gap_s: float = Field(1.0, ge=0.2, le=5.0)
    asr_pack_max_job_s: float = Field(10.0, gt=0, le=24.0)
    asr_pack_max_window_s: float = Field(24.0, gt=1.0, le=29.0)
    asr_pack_min_waiting: int = Field(
        0, ge=0, description="pack only when this many jobs wait; 0 = one more than asr_max_batch, 2 = always"
    )
    asr_pack_min_saving_s: float = Field(
        1.0, ge=0, description="and only when encoding each waiting job alone would take longer than this"
    )
    asr_speech_pad_ms: int = Field(300, ge=0, le=2000)
    asr_encoder_max_windows: int = Field(
        2,
        ge=0,
        description="on the CPU, windows per encoder call (a batch is encoded in chunks: same result, the "
        "attention memory of a chunk, not of the batch); 0 = the whole batch at once",
    )
    asr_replicas: int = Field(
        1,
        ge=1,
        le=16,
        description="CTranslate2 replicas of each local model (weights shared); the scheduler runs this many "
        "batches at once, so one batch's decoding overlaps the next one's encoding; on the CPU the threads "
        "(cpu_threads) are split between them",
    )
    asr_partial_window_s: float = Field(
        10.0,
        ge=1.0,
        le=30.0,
        description="encoder window of partial transcripts (doubled while the speech does not fit); "
        "30 = the full window",
    )
    asr_window_s: dict[str, Annotated[float, Field(ge=1.0, le=30.0)]] = Field(
        default_factory=lambda: {"tiny.en": 10.0},
        description="per model (canonical name), the encoder window of finals and uploads whose speech fits one "
        "window (doubled while it does not: 10, 20, 30 s; a decode that loops or hits the token cap is redone on "
        "30 s); models not listed use Whisper's own 30 s. tiny.en measured as accurate on 10 s; base lost words of "
        "short commands (tools/README.md)",
    )
    asr_guard_max_words_per_s: float = Field(
        6.0,
        ge=0.0,
        description="a decode with more words than this per second of voiced audio (plus one) is a loop: finals "
        "and uploads are decoded again safely (30 s window, no forced prefix, temperature fallback), partials "
        "dropped; 0 = off",
    )
    asr_guard_repeat_min: int = Field(
        3,
        ge=0,
        description="a phrase of two or more words repeated this many times in a row (one word: twice as many) is a "
        "loop, handled as asr_guard_max_words_per_s; 0 = off",
    )

    # --- streaming sessions (WebRTC, WebSocket, Realtime) --------------------------------------
    max_sessions: int = Field(64, ge=1)
    session_idle_timeout_s: float = Field(7 * 24 * 3600.0, gt=0, description="close a session idle this long")
    stream_vad_aggressiveness: int = Field(3, ge=0, le=3)
    stream_vad_hangover_ms: int = Field(500, ge=60, description="silence that ends an utterance")
    stream_vad_preroll_ms: int = Field(300, ge=0, description="audio kept from before speech starts")
    stream_min_speech_ms: int = Field(200, ge=0, description="shorter bursts are ignored")
    stream_max_utterance_s: float = Field(28.0, gt=1.0, le=29.5)
    stream_partial_interval_ms: int = Field(
        300, ge=50, description="a partial decode starts at most this often (from the start of the last one)"
    )
    stream_partial_agreement: int = Field(
        3, ge=2, le=5, description="consecutive partial hypotheses that must agree on a word before it is sent"
    )
    stream_partial_commit_lag_ms: int = Field(
        1000,
        ge=0,
        description="a word is promised only once a partial decode of at least this much more audio than the decode "
        "that first agreed on it still has it: the first second of an utterance alone is often misheard ('How do you "
        "marry' for 'Had he married'), and a promised word cannot be taken back",
    )
    stream_partial_min_audio_ms: int = Field(
        500, ge=100, description="the first partial decode starts once the utterance (with pre-roll) is this long"
    )
    stream_final_early_ms: int = Field(
        200,
        ge=0,
        description="start the final this long before the utterance ends: once the speech has been silent for "
        "stream_vad_hangover_ms minus this, the final is decoded on the audio so far (speech that resumes cancels "
        "it), so it is ready about when the utterance ends; 0 = decode after the end. At 300 (200 ms of silence "
        "with the default hangover) a final through an OpenAI-compatible remote engine lost its last words",
    )
    stream_max_pending_finals: int = Field(
        8,
        ge=1,
        description="utterances of one session waiting for their transcripts; one more is dropped with an "
        "`overloaded` error instead of queueing without bound",
    )
    stream_gap_fill_ms: int = Field(
        120,
        ge=0,
        description="no audio for this long while someone speaks counts as silence (Opus DTX, paused tracks, "
        "devices that stop sending in silence), so the utterance still ends on time; 0 = off",
    )

    # --- WebRTC --------------------------------------------------------------------------------
    rtc_ice_servers: list[str] = Field(default_factory=list, description="stun:/turn: URLs; none = host candidates")
    rtc_turn_username: str | None = None
    rtc_turn_password: str | None = None
    rtc_udp_port_min: int = Field(0, ge=0, le=65535, description="0 = any ephemeral port")
    rtc_udp_port_max: int = Field(0, ge=0, le=65535)
    rtc_connect_timeout_s: float = Field(
        10.0, gt=0, description="an answered offer whose peer has not connected by then is closed (frees its slot)"
    )
    rtc_dead_peer_timeout_s: float = Field(
        5.0,
        ge=0,
        description="a connected peer that sends nothing at all (no media, RTCP, data or ICE) for this long is "
        "closed; after half of it the server sends an ICE consent check to make a live peer answer; 0 = off "
        "(then only ICE consent expiry, ~30 s, ends it)",
    )
    rtc_audio_jitter_frames: int = Field(
        1,
        ge=1,
        le=15,
        description="audio packets an inbound track's jitter buffer holds before passing the oldest on (aiortc's "
        "own: 4, 80 ms added to every end of speech; 1: a packet goes on when the next shows it is whole); "
        "reordered packets are still put in order",
    )
    rtc_opus_dtx: bool = Field(True, description="ask browsers for Opus DTX (silence costs ~2 kbps, not ~25)")
    rtc_idle_rtcp_interval_s: float = Field(
        5.0,
        ge=0,
        description="RTCP reports of a stream with no media since its previous report (a paused microphone, "
        "an assistant not speaking) come every this many seconds (± 50 %) instead of aiortc's 0.5–1.5 s; "
        "0 = aiortc's cadence always",
    )

    # --- WebSocket streams ---------------------------------------------------------------------
    ws_max_message_bytes: int = Field(1024 * 1024, ge=1024)
    ws_heartbeat_s: float = Field(20.0, gt=0)
    ws_idle_timeout_s: float = Field(300.0, gt=0)
    ws_answer_lead_ms: int = Field(200, ge=0, description="answer audio sent ahead of real time (voice loop)")

    # --- OpenAI Realtime conversations (/v1/realtime, /v1/realtime/calls) ------------------------
    realtime_audio_lead_ms: int = Field(
        1000, ge=0, description="WebSocket answer audio sent at most this far ahead of real time"
    )
    realtime_max_items: int = Field(1000, ge=2, description="conversation items kept; older ones are forgotten")
    realtime_max_call_bytes: int = Field(
        256 * 1024, ge=1024, description="POST /v1/realtime/calls body (the SDP offer and the session)"
    )
    # Client secrets (ephemeral keys, /v1/realtime/client_secrets): stateless HMAC-signed tokens.
    realtime_client_secret_key: SecretStr | None = Field(
        None,
        description="the key client secrets are sealed under (AES-256-GCM); the same on every replica so any "
        "accepts them. "
        "Unset: a random key per process (a restart invalidates every secret)",
    )
    realtime_client_secret_default_ttl_s: int = Field(600, ge=10, description="expires_after.seconds by default")
    realtime_client_secret_max_ttl_s: int = Field(7200, ge=10, description="the longest expires_after.seconds")
    realtime_client_secret_max_chars: int = Field(
        4096, ge=256, description="a secret carries its session config: past this length minting is a 400"
    )

    # --- Wyoming (Home Assistant) --------------------------------------------------------------
    wyoming_enabled: bool = True
    wyoming_host: str | None = Field(
        None,
        description="address the Wyoming server listens on; unset = 0.0.0.0, or 127.0.0.1 when auth is on "
        "(Wyoming clients cannot send credentials: exposing it then is an explicit choice)",
    )
    wyoming_allowed_networks: list[str] = Field(
        default_factory=list, description="client networks (CIDRs) allowed to connect; empty = any"
    )
    wyoming_max_connections: int = Field(32, ge=1, description="open Wyoming connections; more get an error")
    wyoming_max_buffered_audio_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="audio held for transcription across all Wyoming connections"
    )
    wyoming_port: int = Field(10300, ge=0, le=65535)
    wyoming_zeroconf: bool = False
    wyoming_zeroconf_name: str = "mediaserver"
    wyoming_max_event_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    wyoming_idle_timeout_s: float = Field(60.0, gt=0)

    # --- features on a GPU (capability gating; on the CPU every installed feature is on) ---------
    vram_asr_mb: int = Field(1500, ge=0, description="VRAM the ASR models need before ASR is enabled")
    vram_tts_mb: int = Field(500, ge=0, description="VRAM TTS needs, taken after ASR's")
    vram_llm_mb: int = Field(4000, ge=0, description="VRAM the LLM needs, taken after ASR's and TTS's")

    # --- speech synthesis (TTS) -----------------------------------------------------------------
    tts_enabled: bool = True
    tts_default_voice: str = "en_US-joe-medium"
    tts_voices_dir: Path = Field(Path("voices"), description="Piper voices (NAME.onnx + NAME.onnx.json)")
    tts_voice_aliases: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_VOICE_ALIASES))
    tts_allow_download: bool = Field(True, description="fetch a Piper voice named by a request into tts_voices_dir")
    tts_download_url: str = PIPER_VOICE_URL
    tts_download_timeout_s: float = Field(120.0, gt=0)
    tts_download_max_bytes: int = Field(300 * 1024 * 1024, ge=1024)
    tts_preload_default_voice: bool = True
    tts_max_input_chars: int = Field(4096, ge=1, description="longer text is refused with 413")
    tts_max_sentence_chars: int = Field(400, ge=20, description="longer runs without a full stop are cut")
    tts_min_speed: float = Field(0.25, gt=0)
    tts_max_speed: float = Field(4.0, gt=0)
    tts_max_queue: int = Field(32, ge=1, description="open requests per voice (waiting or speaking); 503 past it")
    tts_workers_per_voice: int = Field(1, ge=1, le=16, description="sentences of one voice synthesized at once")
    tts_onnx_threads: int = Field(0, ge=0, description="ONNX Runtime threads per voice; 0 = one per core")
    tts_lookahead_sentences: int = Field(2, ge=1, description="sentences a request may run ahead of its reader")
    tts_max_loaded_voices: int = Field(4, ge=1)
    tts_request_timeout_s: float = Field(300.0, gt=0)
    tts_cache_max_bytes: int = Field(64 * 1024 * 1024, ge=0, description="0 turns the response cache off")
    tts_cache_max_entry_bytes: int = Field(8 * 1024 * 1024, ge=0)
    tts_wis_default_format: Literal["WAV", "FLAC", "OGG", "MP3"] = "WAV"
    # --- LLM: chat completions, embeddings, WIS chatbot (mediaserver/llm) ----------------------
    llm_enabled: bool = True
    llm_model: str = Field(
        "",
        description="default chat model: a name, a .gguf path or a Hugging Face 'owner/repo:file.gguf' id; "
        "empty = the upstream's model when llm_upstream_url is set, else the bundled SmolLM2",
    )
    llm_extra_models: dict[str, str] = Field(
        default_factory=dict, description="name -> .gguf path or Hugging Face 'owner/repo:file.gguf' id"
    )
    llm_model_aliases: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_LLM_ALIASES))
    llm_preload: bool = Field(True, description="start the default chat model's engine at start-up, not on first use")
    llm_slots: int = Field(
        4,
        ge=1,
        le=64,
        description="generations one llama-server engine runs at once (--parallel), continuously batched; more "
        "wait in the queue (llm_max_queue)",
    )
    llm_context_tokens: int = Field(
        2048, ge=128, description="context window of each slot (prompt + answer); the engine holds llm_slots of them"
    )
    llm_max_prompt_tokens: int = Field(1792, ge=16, description="longer prompts get a 400")
    llm_max_completion_tokens: int = Field(1024, ge=1, description="cap on a request's max_tokens")
    llm_default_max_tokens: int = Field(
        256,
        ge=1,
        description="max_tokens of a chat request that sets none: an answer that does not end stops here "
        "(a few seconds, not a 15 s runaway)",
    )
    llm_max_queue: int = Field(16, ge=1, description="generations waiting per model; more get a 503")
    llm_request_timeout_s: float = Field(120.0, gt=0, description="queue wait + generation; 504 past it")
    llm_max_request_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="JSON bodies of the LLM APIs")
    llm_threads: int = Field(0, ge=0, description="llama.cpp threads; 0 = half the cores (the rest for ASR)")
    llm_batch_tokens: int = Field(512, ge=16, description="llama.cpp logical batch (-b, n_batch)")
    llm_ubatch_tokens: int = Field(512, ge=16, description="llama.cpp physical batch (-ub, n_ubatch)")
    llm_gpu_layers: int = Field(-1, ge=-1, description="layers offloaded on CUDA builds; -1 = all")
    llm_engine_binary: Path | None = Field(
        None,
        description="the llama-server to run; none = the one `make setup` built (tools/build_llama_cpp.py "
        "--server, in ~/.cache/mediaserver/llama-server), else llama-server on PATH",
    )
    llm_engine_cache_ram_mb: int = Field(
        256, ge=0, description="llama-server's host-memory prompt cache (--cache-ram) beside each slot's own; 0 = off"
    )
    llm_engine_start_timeout_s: float = Field(120.0, gt=0, description="engine start until /health answers ok")
    llm_engine_ready_wait_s: float = Field(
        30.0, gt=0, description="a request waits this long for a restarting engine, then gets a 503"
    )
    llm_engine_restart_backoff_s: float = Field(
        0.5, ge=0, description="pause before restarting a crashed engine, doubled per crash in a row"
    )
    llm_engine_restart_max_backoff_s: float = Field(30.0, ge=0)
    llm_default_temperature: float = Field(0.7, ge=0, le=2, description="for models without defaults of their own")
    llm_default_top_p: float = Field(0.95, gt=0, le=1, description="for models without defaults of their own")
    llm_generation_defaults: dict[str, GenerationDefaults] = Field(
        default_factory=dict,
        description="model name -> sampling defaults applied when a request leaves them out (over the built-in "
        "ones of known models, mediaserver/llm/defaults.py)",
    )
    llm_chat_templates: dict[str, Path] = Field(
        default_factory=dict,
        description="model name -> a Jinja chat template file the llama-server engine uses instead of the GGUF's "
        "own (the bundled SmolLM2 gets one that renders tools, mediaserver/llm/chat_templates/)",
    )
    llm_vision_projectors: dict[str, str] = Field(
        default_factory=dict,
        description="model name -> its multimodal projector (.gguf path or Hugging Face 'owner/repo:file.gguf'): "
        "the llama-server engine then takes image_url parts for that model",
    )
    llm_max_images: int = Field(8, ge=0, description="image_url parts in one chat request; more get a 400")
    llm_system_prompt: str = Field(
        "You are a helpful voice assistant. Answer briefly and clearly.",
        description="system message of the WIS chatbot endpoints (OpenAI clients send their own)",
    )
    llm_upstream_url: str | None = Field(None, description="an OpenAI-compatible base URL, e.g. http://vllm:8000/v1")
    llm_upstream_api_key: str | None = None
    llm_upstream_models: list[str] = Field(
        default_factory=list, description="models to offer from the upstream; empty = what it lists at start-up"
    )
    llm_upstream_connect_timeout_s: float = Field(5.0, gt=0)
    llm_upstream_timeout_s: float = Field(60.0, gt=0, description="silence from the upstream before a 504")
    llm_upstream_retries: int = Field(2, ge=0, description="retries after a connect error (never after a timeout)")
    llm_upstream_max_concurrency: int = Field(8, ge=1, description="generations in flight to the upstream")
    llm_embedding_model: str = Field(
        "", description="a name, .gguf path or hub id; empty = the default chat model if a GGUF, else the bundled one"
    )
    llm_embedding_aliases: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_EMBEDDING_ALIASES))
    llm_embedding_pooling: Literal["auto", "mean", "cls", "last"] = Field(
        "auto", description="auto = the model's own pooling, mean for chat models that have none"
    )
    llm_embedding_batch_window_ms: float = Field(5.0, ge=0, description="collect concurrent inputs this long")
    llm_embedding_max_batch: int = Field(32, ge=1, description="inputs per llama.cpp embedding call")
    llm_embedding_max_inputs: int = Field(256, ge=1, description="inputs per request")
    llm_embedding_max_input_tokens: int = Field(512, ge=8, description="longer inputs get a 400")
    llm_embedding_cache_entries: int = Field(4096, ge=0, description="LRU cache of embeddings; 0 = off")

    # --- the voice loop: answers spoken back on WebRTC and device sockets (mediaserver/assistant) --
    assistant_system_prompt: str = Field(
        "You are a friendly voice assistant. Answer in one to three short sentences of plain spoken "
        "language, without lists or markup.",
        description="the system prompt of spoken conversations (a client may send its own)",
    )
    assistant_speak: bool = Field(True, description="speak answers (false: text only)")
    assistant_voice: str | None = Field(None, description="TTS voice of answers; none = tts_default_voice")
    assistant_llm_model: str | None = Field(None, description="LLM of answers; none = llm_model")
    assistant_max_answer_tokens: int = Field(200, ge=1, description="cap on one spoken answer")
    assistant_temperature: float | None = Field(None, ge=0, le=2, description="none = llm_default_temperature")
    assistant_history_turns: int = Field(8, ge=0, description="earlier user turns sent with each question")
    assistant_history_tokens: int = Field(
        1500, ge=0, description="and at most this much history (estimated at 4 characters a token)"
    )
    assistant_turn_timeout_s: float = Field(
        30.0, gt=0, description="an answer whose LLM and TTS produce nothing for this long ends with an error"
    )
    assistant_barge_in: bool = Field(True, description="the user speaking stops the answer being played")
    assistant_first_clause_words: int = Field(
        4,
        ge=0,
        description="speak the answer's first clause (at a comma) once it has this many words; 0 = whole sentences",
    )
    assistant_client_tool_timeout_s: float = Field(
        10.0,
        gt=0,
        description="WebRTC: the page's answer to a call of a tool it declared (start.obj tools); past it the model "
        "gets an error result (keep it below assistant_turn_timeout_s)",
    )

    # --- wake words and noise suppression (mediaserver/wake, mediaserver/audio/noise.py) -----------
    wake_enabled: bool = Field(True, description="offer wake word detection (Wyoming, device streams)")
    wake_models_dir: Path | None = Field(
        None, description="custom microWakeWord models (a JSON config beside each .tflite); none = built-ins only"
    )
    wake_refractory_s: float = Field(
        2.0, ge=0, description="after a detection, the same wake word is not reported again for this long"
    )
    wake_default_models: list[str] = Field(
        default_factory=lambda: ["okay_nabu"],
        description="wake words of device streams that name none; empty = every model",
    )
    wake_conversation_timeout_s: float = Field(
        0.0,
        ge=0,
        description="after a wake word, device streams keep listening this long after each answer; 0 = one utterance",
    )
    wake_listen_timeout_s: float = Field(
        8.0, gt=0, description="after a wake word, back to waiting if no speech starts within this long"
    )
    noise_suppression_level: int = Field(
        2, ge=1, le=4, description="WebRTC noise suppression level when a stream turns it on (1 low .. 4 very high)"
    )
    noise_auto_gain_dbfs: int = Field(
        3, ge=0, le=31, description="WebRTC automatic gain target (dBFS below full scale) with suppression; 0 = off"
    )
    noise_default: bool = Field(False, description="suppress noise on every stream unless it asks otherwise")
    noise_near_field_level: int = Field(1, ge=1, le=4, description="level for Realtime noise_reduction near_field")
    noise_far_field_level: int = Field(2, ge=1, le=4, description="level for Realtime noise_reduction far_field")

    # --- semantic end of turn: Smart Turn v3.2 (mediaserver/turns) -----------------------------
    turn_detection: Literal["silence", "semantic"] = Field(
        "silence",
        description="how a streamed utterance ends when its session does not choose: 'silence' (after "
        "stream_vad_hangover_ms) or 'semantic' (the turn model decides at each pause, see turn_*)",
    )
    turn_eagerness: Literal["low", "medium", "high", "auto"] = Field(
        "auto", description="semantic turns: how long an unfinished turn is waited for (turn_wait_*_ms); auto = medium"
    )
    turn_model_path: Path | None = Field(
        None,
        description="the Smart Turn v3.2 ONNX file; none = ~/.cache/mediaserver/turn/smart-turn-v3.2-cpu.onnx "
        "(make setup fetches it); missing = semantic turns fall back to silence detection",
    )
    turn_candidate_silence_ms: int = Field(
        200, ge=30, description="semantic turns: a pause this long is scored by the turn model"
    )
    turn_rescore_ms: int = Field(
        300,
        ge=0,
        description="semantic turns: a pause scored unfinished is scored again each time it has gone on this much "
        "longer (the model grows surer with more silence), until the eagerness cap; 0 = once per pause",
    )
    turn_threshold: float = Field(
        0.5, gt=0, lt=1, description="semantic turns: a score (probability of a finished turn) at least this ends it"
    )
    turn_rescore_threshold: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="semantic turns: the score that ends the turn at a rescore (the model scores a fragment higher "
        "the longer the silence after it: 'Remind me to buy' 0.01 after 200 ms, 0.84 after 500 ms)",
    )
    turn_wait_low_ms: int = Field(8000, ge=60, description="eagerness low: silence that ends an unfinished turn")
    turn_wait_medium_ms: int = Field(4000, ge=60, description="eagerness medium/auto: the same")
    turn_wait_high_ms: int = Field(2000, ge=60, description="eagerness high: the same")
    turn_threads: int = Field(1, ge=1, description="onnxruntime threads of one turn-model inference")
    turn_batch_max: int = Field(
        8, ge=1, description="pauses of different sessions waiting together are scored in one batch of up to this"
    )
    turn_speculative_answers: bool = Field(
        True,
        description="voice loop: start the answer (LLM and first clause's TTS, nothing sent) on the final decoded in "
        "a pause, before the turn has ended; speech resuming drops it unheard, the turn ending sends it at once",
    )

    # --- tools from MCP servers for the voice loop (mediaserver/assistant/mcp.py) ---------------
    mcp_servers: list[McpServerConfig] = Field(
        default_factory=list, description="MCP servers whose tools the assistant may call (JSON list)"
    )
    mcp_connect_timeout_s: float = Field(10.0, gt=0, description="connecting to a server and listing its tools")
    mcp_reconnect_s: float = Field(10.0, gt=0, description="wait before connecting again to a server that is down")
    mcp_call_timeout_s: float = Field(10.0, gt=0, description="one tool call; past it the model gets an error result")
    mcp_max_calls_per_turn: int = Field(4, ge=1, description="tool calls in one answer; more end it with an error")
    mcp_max_result_chars: int = Field(
        4000, ge=100, description="a tool result longer than this is cut for the model, with a note"
    )
    mcp_tool_choice: Literal["auto", "required"] = Field(
        "auto", description="required: every spoken answer starts with a tool call (for models that never choose one)"
    )
    # Realtime sessions' own ``type: "mcp"`` tools (transport/openai/realtime/mcp_tools.py): a client
    # telling the server to connect somewhere is a request forgery risk, so only these are reached.
    realtime_mcp_allowed_urls: list[str] = Field(
        default_factory=list,
        description="URL prefixes a Realtime client's MCP server_url may start with (scheme, host and port "
        "must match, the path must be under the prefix's); empty: client-given URLs are refused",
    )
    realtime_mcp_operator_servers: bool = Field(
        True,
        description="a Realtime MCP tool without server_url whose server_label names one of mcp_servers uses "
        "that server (its URL, headers or command stay the operator's)",
    )
    realtime_mcp_max_servers: int = Field(4, ge=1, le=32, description="type mcp tools in one Realtime session")

    # --- misc ----------------------------------------------------------------------------------
    malloc_arena_max: int = Field(
        2, ge=0, description="glibc malloc arenas (as MALLOC_ARENA_MAX); fewer keep RSS down; 0 = glibc's default"
    )
    retry_after_fallback_s: float = Field(
        5.0, gt=0, description="Retry-After of a transient 503 the server cannot estimate (session cap, shutdown)"
    )
    save_audio_dir: Path = Path("audio")
    allow_save_audio: bool = True
    log_level: str = "INFO"

    @field_validator("default_language")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.strip().lower()

    @field_validator("wyoming_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            ipaddress.ip_network(network.strip(), strict=False)  # ValueError names the bad entry
        return [network.strip() for network in value]

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys) or self.basic_auth_user is not None

    def wyoming_bind_host(self) -> str:
        """Where Wyoming listens: ``wyoming_host`` when set, else loopback when auth is on, else all."""
        if self.wyoming_host is not None:
            return self.wyoming_host
        return "127.0.0.1" if self.auth_enabled else "0.0.0.0"

    def cert_paths(self) -> tuple[Path, Path]:
        return self.cert_dir / "cert.pem", self.cert_dir / "key.pem"

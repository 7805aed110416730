"""Settings of speech recognition: models (local and remote), device, decoding, the VAD gate, the scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator, model_validator

from mediaserver.config.keep_alive import KeepAliveSeconds, keep_alive_field

DEFAULT_MODEL_ALIASES: dict[str, str] = {
    # OpenAI model names map to the default model: SDK users keep their code unchanged
    # (gpt-4o-transcribe-diarize too: response_format=diarized_json adds the speakers to any model).
    "whisper-1": "@default",
    "gpt-4o-transcribe": "@default",
    "gpt-4o-mini-transcribe": "@default",
    "gpt-4o-transcribe-diarize": "@default",
    "gpt-transcribe": "@default",
    "gpt-4o-mini-transcribe-2025-12-15": "@default",
    "gpt-live-transcribe": "@default",
    "gpt-realtime-whisper": "@default",
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
    retries: int = Field(
        2,
        ge=0,
        le=10,
        description="retries after a connection error: none made, or one dropped before the answer (the audio may "
        "have been sent; a transcription changes nothing upstream, so a repeat is safe); never after a timeout or "
        "an error answer",
    )
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

    @model_validator(mode="after")
    def _one_kind_of_credentials(self) -> RemoteModel:
        # Both would fail every request (a 502: the HTTP client refuses two Authorization headers),
        # which an operator trial found only at the first request.
        if self.api_key is not None and urlsplit(self.url).username is not None:
            raise ValueError(
                f"give the credentials of {urlsplit(self.url).hostname} once: in the url (user:password@) or as "
                "api_key, not both"
            )
        return self


def _renamed(name: str, old: str) -> AliasChoices:
    """A setting that was renamed: read from ``MEDIASERVER_<NAME>``, or else from the variable of its
    old name (``MEDIASERVER_<OLD>``), so deployments configured before the rename keep working."""
    return AliasChoices(f"mediaserver_{name}", f"mediaserver_{old}")


class AsrSettings(BaseModel):
    """ASR models, device, decoding defaults, VAD gate and the shared scheduler (part of ``Settings``)."""

    # --- models --------------------------------------------------------------------------------
    asr_default_model: str = Field(
        "tiny.en",
        validation_alias=_renamed("asr_default_model", "default_model"),
        description="the model of a request that names none, and what OpenAI's model names mean; was `default_model`",
    )
    translation_model: str = Field(
        "base",
        description="the multilingual model that translates, and transcribes a language other than English, for "
        "a request that names no model of ours (none, or an OpenAI name such as whisper-1: Home Assistant's "
        "Wyoming, a device stream's language, Realtime) when the default is English-only; a model the client "
        "names is kept (and refuses what it cannot do)",
    )
    asr_preload_models: list[str] = Field(
        default_factory=lambda: ["tiny.en"],
        validation_alias=_renamed("asr_preload_models", "preload_models"),
        description="models loaded at start (the others load on first use); was `preload_models`",
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
        description="names clients send → a model (`@default`: `asr_default_model`); was `model_aliases`",
    )
    wis_size_fallback: bool = Field(
        True,
        description="a WIS size (`tiny` … `large`) whose Systran model is not in the Hugging Face cache is "
        "served by the closest installed model; false: a 400",
    )
    allow_model_download: bool = Field(
        True,
        description="models named by a Hugging Face id (ASR and LLM) are downloaded on first use; false: only "
        "what is cached",
    )
    model_cache_dir: Path = Field(
        Path.home() / ".cache" / "mediaserver" / "models",
        description="where the bundled `base` is assembled and GGUF files are downloaded (`gguf/`)",
    )
    max_loaded_models: int = Field(
        4, ge=1, description="ASR models kept loaded; the least recently used is unloaded when idle"
    )
    asr_keep_alive_s: KeepAliveSeconds = keep_alive_field("a local Whisper model")

    # --- device --------------------------------------------------------------------------------
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="`auto`: CUDA when NVIDIA's driver and a CUDA build of CTranslate2 are there, else the CPU"
    )
    compute_type: str = Field(
        "auto",
        description="CTranslate2's compute type; `auto`: `int8_float16` on GPUs of compute capability 7.0 and "
        "up, `int8` on older GPUs and the CPU",
    )
    cpu_threads: int = Field(0, ge=0, description="0 = one per core")

    # --- decoding defaults ---------------------------------------------------------------------
    default_language: str = Field(
        "en",
        description="the language of a request or stream that names none (WIS requests, device and WebRTC streams) "
        "and the one a remote ASR engine is asked for then",
    )
    default_beam_size: int = Field(1, ge=1, le=10, description="the beam width of a request that names none")
    max_beam_size: int = Field(10, ge=1, description="the largest `beam_size` a request may ask for (a 400 past it)")
    asr_upload_timestamps: bool = Field(
        True,
        description="uploads (OpenAI's /v1/audio/transcriptions and translations, WIS / Willow's): decode with "
        "Whisper's timestamps whatever the response_format, so json, text, verbose_json, srt, vtt and WIS give the "
        "same text (without them tiny.en said a 2.2 s question twice for json and once for verbose_json, and "
        "looped on a 1 s '10 of clubs'); false: json, text and WIS without them, about 3 % faster",
    )
    asr_vocabulary: str = Field(
        "",
        description="words Whisper should expect (names, jargon: 'Gregson, Kubernetes'), put before every "
        "decode's own prompt on every face (asr/vocabulary.py); empty = none",
    )
    asr_max_prompt_chars: int = Field(
        600,
        ge=1,
        le=4000,
        description="asr_vocabulary and a request's or session's prompt together hold at most this many characters "
        "(a longer prompt is a 400 / an error event); Whisper reads at most 223 prompt tokens and keeps the last",
    )

    # --- VAD gate ------------------------------------------------------------------------------
    vad_aggressiveness: int = Field(
        2, ge=0, le=3, description="webrtcvad's mode (0-3) in the ASR silence gate before a decode"
    )
    vad_min_speech_ms: int = Field(
        120, ge=0, description="audio with less speech than this (the silence gate's webrtcvad) is answered as silence"
    )
    asr_vad_filter: bool = Field(True, description="faster-whisper's own Silero VAD, after the webrtcvad gate")

    # --- ASR scheduler -------------------------------------------------------------------------
    asr_max_batch: int = Field(
        8,
        ge=1,
        description="jobs per batch of the shared ASR scheduler, and windows per decoder call (a long upload's "
        "windows go in calls of this many: one whose client hung up stops between them)",
    )
    asr_max_wait_ms: float = Field(5.0, ge=0, description="close a batch when no job arrived for this long")
    asr_max_collect_ms: float = Field(
        50.0,
        ge=0,
        description="close a batch after collecting this long in all; below asr_max_wait_ms it acts as that (a "
        "lone job always waits asr_max_wait_ms)",
    )
    asr_max_queue: int = Field(64, ge=1, description="ASR jobs waiting per model; past it a 503 with Retry-After")
    asr_request_timeout_s: float = Field(
        300.0, gt=0, description="an ASR job's deadline, waiting and decoding; a 504 past it"
    )
    asr_batching: bool = Field(
        True,
        description="decode a job's speech as windows batched with other jobs'; false (and for word "
        "timestamps or a sampling temperature): faster-whisper's own sequential decode",
    )
    asr_pack_windows: bool = Field(
        True,
        description="pack short utterances into shared 30 s windows, only under a backlog (docs: Speech "
        "recognition, Encoder windows and packing)",
    )
    asr_pack_gap_s: float = Field(1.0, ge=0.2, le=5.0, description="silence between packed utterances")
    asr_pack_max_job_s: float = Field(10.0, gt=0, le=24.0, description="the longest utterance packed")
    asr_pack_max_window_s: float = Field(24.0, gt=1.0, le=29.0, description="the packed audio per window")
    asr_pack_min_waiting: int = Field(
        0, ge=0, description="pack only when this many jobs wait; 0 = one more than asr_max_batch, 2 = always"
    )
    asr_pack_min_saving_s: float = Field(
        1.0, ge=0, description="and only when encoding each waiting job alone would take longer than this"
    )
    asr_speech_pad_ms: int = Field(
        300, ge=0, le=2000, description="the audio kept around each stretch of speech when a job is cut into windows"
    )
    asr_lead_silence_ms: int = Field(
        100,
        ge=0,
        le=1000,
        description="an upload (not a stream's utterance) whose speech starts at once (in the first half of this) "
        "is decoded after silence making up this much before it: without it tiny.en heard Piper's 'Turn on the "
        "kitchen lights.' as 'on the kitchen lights.' (docs/asr.md, tools/README.md: eval_lead.py); 0 = none",
    )
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
        "window (doubled while it does not: 10, 20, 30 s; a decode that loops, hits the token cap, says a phrase twice "
        "or scores above Whisper's no-speech threshold is redone on "
        "30 s); models not listed use Whisper's own 30 s. tiny.en measured as accurate on 10 s; base lost words of "
        "short commands (tools/README.md)",
    )
    asr_guard_max_words_per_s: float = Field(
        6.0,
        ge=0.0,
        description="a decode with more words than this per second of voiced audio (plus one) is a loop: finals "
        "and uploads are decoded again safely (30 s window, no forced prefix, temperature fallback), partials "
        "dropped; a decode of several windows is judged and redecoded window by window; 0 = off",
    )
    asr_guard_repeat_min: int = Field(
        3,
        ge=0,
        description="a phrase of two or more words repeated this many times in a row (one word: twice as many) is a "
        "loop, handled as asr_guard_max_words_per_s; 0 = off",
    )

    @field_validator("default_language")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.strip().lower()

    @field_validator("asr_vocabulary")
    @classmethod
    def _vocabulary(cls, value: str) -> str:
        return value.strip()

    @model_validator(mode="after")
    def _vocabulary_fits(self) -> AsrSettings:
        if len(self.asr_vocabulary) > self.asr_max_prompt_chars:
            raise ValueError(
                f"asr_vocabulary is {len(self.asr_vocabulary)} characters, longer than asr_max_prompt_chars "
                f"({self.asr_max_prompt_chars})"
            )
        return self

"""Settings of speech synthesis (Piper voices, mediaserver/tts)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from mediaserver.config.keep_alive import KeepAliveSeconds, keep_alive_field

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


class TtsSettings(BaseModel):
    """TTS voices, downloads, limits and the response cache (part of ``Settings``)."""

    # --- speech synthesis (TTS) -----------------------------------------------------------------
    tts_enabled: bool = Field(
        True, description="false turns TTS off: every TTS endpoint answers 503 `feature_disabled`"
    )
    tts_default_voice: str = Field(
        "en_US-joe-medium", description="the voice of a request that names none (and of `@default`)"
    )
    tts_voices_dir: Path = Field(Path("voices"), description="Piper voices (NAME.onnx + NAME.onnx.json)")
    tts_voice_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_VOICE_ALIASES),
        description="voice names clients send (OpenAI's, WIS's) → a voice (`@default`: `tts_default_voice`); "
        "a value replaces the whole map",
    )
    tts_allow_download: bool = Field(True, description="fetch a Piper voice named by a request into tts_voices_dir")
    tts_download_url: str = Field(
        PIPER_VOICE_URL,
        description="where Piper voices are downloaded from (the rhasspy/piper-voices repository on Hugging Face)",
    )
    tts_download_timeout_s: float = Field(
        120.0, gt=0, description="a voice file's whole download, and each wait for data within it"
    )
    tts_download_max_bytes: int = Field(300 * 1024 * 1024, ge=1024, description="the largest voice file downloaded")
    tts_preload_default_voice: bool = Field(True, description="load the default voice at start, not on first use")
    tts_max_input_chars: int = Field(4096, ge=1, description="longer text is refused with 413")
    tts_max_streamed_chars: int = Field(
        32768,
        ge=1,
        description="a text streamed in pieces (Wyoming's synthesize-chunk: an LLM's answer, spoken sentence by "
        "sentence as it comes) is spoken up to this many characters; past it the client gets one error event "
        "(text_too_long), the sentences within it are still spoken, the rest is dropped and the stream ends as "
        "usual (about 35 minutes of speech)",
    )
    tts_max_sentence_chars: int = Field(400, ge=20, description="longer runs without a full stop are cut")
    tts_min_speed: float = Field(0.25, gt=0, description="the slowest `speed` a request may ask for (a 400 below it)")
    tts_max_speed: float = Field(4.0, gt=0, description="the fastest `speed` a request may ask for (a 400 above it)")
    tts_max_queue: int = Field(32, ge=1, description="open requests per voice (waiting or speaking); 503 past it")
    tts_workers_per_voice: int = Field(1, ge=1, le=16, description="sentences of one voice synthesized at once")
    tts_onnx_threads: int = Field(0, ge=0, description="ONNX Runtime threads per voice; 0 = one per core")
    tts_lookahead_sentences: int = Field(2, ge=1, description="sentences a request may run ahead of its reader")
    tts_max_loaded_voices: int = Field(
        4, ge=1, description="voices kept loaded; the least recently used is unloaded past it"
    )
    tts_keep_alive_s: KeepAliveSeconds = keep_alive_field("a Piper voice")
    tts_noise_scale: float | None = Field(
        None,
        ge=0,
        le=2,
        description="Piper's noise_scale (the variation of the voice's sound; --noise-scale of Piper and "
        "wyoming-piper); unset = the voice's own (0.667 for most). Each synthesis draws new noise: with this "
        "and tts_noise_w_scale at 0 the same text gives the same audio every time",
    )
    tts_noise_w_scale: float | None = Field(
        None,
        ge=0,
        le=2,
        description="Piper's noise_w (the variation of the phonemes' lengths; --noise-w-scale); unset = the voice's "
        "own (0.8 for most)",
    )
    tts_request_timeout_s: float = Field(300.0, gt=0, description="a 504 if no audio came by then; a stream is cut off")
    tts_cache_max_bytes: int = Field(64 * 1024 * 1024, ge=0, description="0 turns the response cache off")
    tts_cache_max_entry_bytes: int = Field(
        8 * 1024 * 1024, ge=0, description="the largest answer the response cache keeps"
    )
    tts_wis_default_format: Literal["WAV", "FLAC", "OGG", "MP3"] = Field(
        "WAV", description="the format of a `/api/tts` request without `format`"
    )
    tts_wis_whole_wav_s: float = Field(
        5.0,
        ge=0,
        description="a WIS route's WAV answer of more than one sentence (`/api/tts`, `/api/sts`, `/api/chatbot/tts`) "
        "is sent whole, with its real sizes, when it is ready within this many seconds of the request; past it, it "
        "streams on with XTTS's zero-size header, before a Willow device's 10 s timeout (0 = streamed at once)",
    )

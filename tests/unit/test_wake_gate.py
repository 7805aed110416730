"""The wake gate on its own: Piper audio through a real detector, session events played by hand."""

from __future__ import annotations

import numpy as np
import pytest

from mediaserver.config import Settings
from mediaserver.errors import ApiError
from mediaserver.events import FinalTranscript, SpeechStarted, SpeechStopped, Transcript
from mediaserver.wake.detector import WakeDetection, WakeDetector
from mediaserver.wake.gate import WakeGate, WakeWaiting, observe, parse_wake_option
from mediaserver.wake.models import WakeModels
from tests.conftest import synthesize

PIECE = 320


def pieces(audio: np.ndarray) -> list[np.ndarray]:
    return [audio[i : i + PIECE] for i in range(0, audio.size, PIECE)]


def gate(conversation_s: float = 0.0, listen_s: float = 2.0) -> WakeGate:
    detector = WakeDetector(WakeModels.load(), ["okay_nabu"])
    return WakeGate(detector, listen_timeout_s=listen_s, conversation_timeout_s=conversation_s)


def run(g: WakeGate, audio: np.ndarray) -> tuple[int, list[WakeDetection | WakeWaiting]]:
    passed = 0
    changes: list[WakeDetection | WakeWaiting] = []
    for piece in pieces(audio):
        out, change = g.feed(piece)
        passed += 0 if out is None else out.size
        if change is not None:
            changes.append(change)
    return passed, changes


def final() -> FinalTranscript:
    transcript = Transcript(text="turn on the lights", language="en", language_probability=1.0, duration_s=1.0)
    return FinalTranscript(transcript=transcript, delta="", audio_start_ms=0, audio_end_ms=1000, latency_ms=1.0)


def test_nothing_passes_before_the_wake_word() -> None:
    g = gate()
    passed, changes = run(g, synthesize("Turn on the kitchen lights and close the garage door.").audio16k)
    assert passed == 0 and changes == [] and not g.listening
    g.close()


def test_wake_word_opens_then_one_utterance_closes() -> None:
    g = gate()
    wake = np.concatenate([np.zeros(8000, np.float32), synthesize("okay nabu").audio16k])
    passed, changes = run(g, wake)
    assert len(changes) == 1 and isinstance(changes[0], WakeDetection) and g.listening
    command = synthesize("turn on the lights").audio16k
    passed, changes = run(g, command[: command.size // 2])
    assert passed > 0 and changes == []
    observe(g, SpeechStarted(audio_start_ms=0))
    assert observe(g, final()) == WakeWaiting("utterance_done")
    passed, _ = run(g, command)
    assert passed == 0 and not g.listening
    g.close()


def test_no_speech_after_the_wake_word_times_out() -> None:
    g = gate(listen_s=1.0)
    run(g, synthesize("okay nabu").audio16k)
    assert g.listening
    _, changes = run(g, np.zeros(16000 * 2, np.float32))
    assert changes == [WakeWaiting("no_speech")]
    g.close()


def test_a_gap_in_the_senders_audio_counts_towards_the_listen_timeout() -> None:
    """A review: under Opus DTX the silence after the wake word comes as gaps (``gap``), not audio,
    and the listen timeout counted only the audio; the gate's clock and its wait both go on now."""
    g = gate(listen_s=1.0)
    run(g, synthesize("okay nabu").audio16k)
    assert g.listening
    before = g.detector.position_ms
    g.gap(16000 * 2)  # 2 s sent as nothing
    assert g.detector.position_ms - before == 2000
    _, changes = run(g, np.zeros(PIECE, np.float32))  # the next audio tells it
    assert changes == [WakeWaiting("no_speech")]
    g.close()


def test_discarded_speech_keeps_waiting_for_the_command_and_conversation_times_out() -> None:
    g = gate(conversation_s=1.0, listen_s=5.0)
    run(g, synthesize("okay nabu").audio16k)
    observe(g, SpeechStarted(audio_start_ms=0))
    observe(g, SpeechStopped(audio_end_ms=100, discarded=True))  # a cough: still listening
    assert observe(g, final()) is None and g.listening  # conversation: stays open after a final
    _, changes = run(g, np.zeros(8000, np.float32))
    assert changes == [] and g.listening
    _, changes = run(g, np.zeros(16000, np.float32))
    assert changes == [WakeWaiting("conversation_timeout")]
    g.close()


def test_parse_wake_option() -> None:
    settings = Settings(_env_file=None)
    assert parse_wake_option(None, settings) is None
    assert parse_wake_option(False, settings) is None
    assert parse_wake_option(True, settings) == ["okay_nabu"]
    assert parse_wake_option("Hey Jarvis, alexa", settings) == ["hey_jarvis", "alexa"]
    assert parse_wake_option(["hey_mycroft"], settings) == ["hey_mycroft"]
    with pytest.raises(ApiError) as caught:  # the start option's key, as ws-protocol.md says of a bad value
        parse_wake_option("nope", settings)
    assert (caught.value.code, caught.value.param) == ("model_not_found", "wake")

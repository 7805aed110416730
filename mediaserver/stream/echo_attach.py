"""A stream session's side of its transport's echo canceller (audio/echo_line.py, docs/echo.md).

The transport owns the canceller and cleans the audio before it feeds the session; ``SessionEcho``
is what the session does with it once attached: barge-in's residual rules ask it what the canceller
took out of an utterance (``removed``) and how much of it was the canceller's residual echo
(``residual_share``), the segmenter gets a ``SpeechGate`` over the canceller's output, and
``echo_cancellation: auto``'s decision and the delay tracker's changes are counted in ``/metrics``
and logged with the session's id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mediaserver.audio.echo import SpeechGate
from mediaserver.audio.echo_line import EchoLine
from mediaserver.audio.echo_presence import EchoPresence
from mediaserver.audio.segmenter import VadSegmenter
from mediaserver.config import Settings
from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)


class SessionEcho:
    """The echo canceller attached to one stream session, if any."""

    def __init__(self, session_id: str, settings: Settings, metrics: Metrics) -> None:
        self.session_id = session_id
        self.settings = settings
        self.metrics = metrics
        # What the canceller took out of the audio fed from ``a`` to ``b`` ms before the latest
        # (``EchoCheck``'s residual rule); None: no canceller attached.
        self.removed: Callable[[int, int], float | None] | None = None
        # The share of the voiced frames from ``a`` to ``b`` ms before the latest that were the
        # canceller's residual echo (``SpeechGate.residual_share``, the word check's residual share);
        # None: no speech gate.
        self.residual_share: Callable[[float, float], float | None] | None = None
        self._line: EchoLine | None = None

    @property
    def cancelling(self) -> bool:
        """A canceller is attached, and cancels: ``auto`` has not found the microphone free of echo."""
        return self.removed is not None and not (self._line is not None and self._line.canceller.passing)

    def attach(self, line: EchoLine | None, segmenter: VadSegmenter) -> None:
        """The transport's canceller cleans the audio fed to the session, or no longer does (None):
        barge-in's residual rule measures it, and while its echo can be arriving only speech well
        above its output's floor starts an utterance (``SpeechGate``)."""
        self.removed = line.removed_db if line is not None else None
        self._line = line
        if line is not None and line.canceller.detect is not None:
            line.canceller.detect.on_decide = self._found
        if line is not None and line.canceller.tracker is not None:
            line.canceller.tracker.on_change = self._delay_changed
        gate = segmenter.gate
        if line is None or self.settings.echo_speech_gate_db <= 0:
            segmenter.gate = None
        elif not isinstance(gate, SpeechGate) or gate.canceller is not line.canceller:
            # (The same canceller attached again, as a Realtime session.update does, keeps its gate:
            # the floor it learnt is the same line's.)
            segmenter.gate = SpeechGate.of(line.canceller, self.settings)
        self.residual_share = segmenter.gate.residual_share if isinstance(segmenter.gate, SpeechGate) else None

    def answering(self, answering: bool, segmenter: VadSegmenter) -> None:
        """Whether the session answers (a voice loop, whose barge-in reads the speech gate's residual
        notes): where it does not (a Realtime conversation, a transcription-only stream), the gate
        does not run the measure for them."""
        if isinstance(segmenter.gate, SpeechGate):
            segmenter.gate.read = answering

    def answer_waits(self, waits: bool, segmenter: VadSegmenter) -> None:
        """The utterance in progress holds the paused answer (or no longer does): while it does, the
        speech gate notes its voiced frames too, for the word check's residual share (not measured
        where nothing will read it: ``assistant_barge_in_echo_residual_share`` 0)."""
        if isinstance(segmenter.gate, SpeechGate):
            segmenter.gate.notes_utterance = waits and self.settings.assistant_barge_in_echo_residual_share > 0

    def _found(self, presence: EchoPresence) -> None:
        """``echo_cancellation`` auto decided whether this microphone carries the answers' echo."""
        self.metrics.echo_auto.labels("echo" if presence.echo else "none").inc()
        if presence.echo:
            found = "carries the answers' echo: cancelled"
        else:
            found = "is streamed faster than real time: passed" if presence.streamed else "carries no echo: passed"
        likeness = "-" if presence.likeness is None else f"{presence.likeness:.2f}"
        log.info(
            "session %s: echo_cancellation auto: the microphone %s (likeness %s)", self.session_id, found, likeness
        )

    def _delay_changed(self, change: str, delay_ms: float) -> None:
        """The canceller's delay tracker (audio/echo_delay.py) moved the reference to a later echo,
        or found AEC3 on a new delay of its own."""
        self.metrics.echo_delay_changes.labels(change).inc()
        what = "re-aligned the answer audio to it" if change == "moved" else "the canceller found it itself"
        log.info("session %s: the echo's delay moved to %.0f ms; %s", self.session_id, delay_ms, what)

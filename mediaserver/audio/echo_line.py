"""The clock of a stream whose answers go out as audio messages (the device WebSocket, the Realtime
WebSocket): where each answer plays against the microphone audio, and the ``EchoCanceller`` that
cleans that audio (echo.py).

The device plays what it is sent back to back, as it arrives; the server counts the microphone
audio as it arrives, so an answer sent when ``mic_arrived`` samples had come plays from there (or
right after the audio sent before it). Gaps in the microphone audio (a device that stops sending,
or one whose first audio comes only after answers went out) move the clock on; audio held up on
its way and then sent in a burst is no gap (docs/echo.md, stop 52). ``auto`` turns the canceller
off for audio streamed faster than real time (a file, not a microphone).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from mediaserver.audio.decode import PcmFormat
from mediaserver.audio.echo import ONSET_GAP_MS, EchoCanceller, EchoMode
from mediaserver.audio.echo_delay import RESIDUAL_WINDOW_S, DelayTracker, ResidualEcho
from mediaserver.audio.echo_presence import EchoPresence
from mediaserver.audio.stream_decode import PcmStreamDecoder
from mediaserver.config import Settings
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray

MAX_LINE_AHEAD_S: Final = 60.0  # EchoLine: answer audio this far ahead of the microphone plays from now
MIC_GAP_S: Final = 1.0  # EchoLine: microphone audio this late after the end of the audio before: a gap
STREAMED_AHEAD_S: Final = 1.0  # EchoLine, auto: audio this far ahead of real time is streamed, not live
ALIGN_WAIT_S: Final = 0.06  # EchoLine.align_start: the longest an answer's first frame waits for the microphone
# (the defaults of the settings echo_max_ahead_s, echo_mic_gap_ms, echo_auto_streamed_ahead_s and
# echo_align_wait_ms, which EchoLine.of applies)


class EchoLine:
    """The canceller of one stream that sends its answers as audio messages (the device WebSocket,
    the Realtime WebSocket), with the clock that places them.

    The device plays what it is sent back to back, as it arrives: a message sent when ``mic_arrived``
    microphone samples had arrived plays from then, or right after the audio sent before it. The
    reader counts the microphone audio as it arrives (``arrived``); the worker cleans it
    (``process``) in the same order, so both clocks start at the audio fed after the line is made.
    """

    def __init__(
        self,
        queued_samples: int = 0,
        *,
        watch_gaps: bool = True,
        gap_s: float = MIC_GAP_S,
        max_ahead_s: float = MAX_LINE_AHEAD_S,
        streamed_ahead_s: float = STREAMED_AHEAD_S,
        align_wait_s: float = ALIGN_WAIT_S,
        restart_gap_s: float = ONSET_GAP_MS / 1000.0,
        tracker: DelayTracker | None = None,
        residual_max_ms: float | None = None,
    ) -> None:
        # ``tracker``: the delay tracker (DelayTracker.of: echo_delay_track_s, on in the server's
        # settings by default; None here: off).
        # ``residual_max_ms``: measure the residual echo over delays up to this, for a speech gate with
        # echo_speech_gate_residual or echo_speech_gate_residual_suspect on (None: not measured).
        measure = ResidualEcho(RESIDUAL_WINDOW_S, residual_max_ms) if residual_max_ms is not None else None
        self.canceller = EchoCanceller(tracker=tracker, residual=measure)
        self.align_wait_s = align_wait_s
        self.restart_gap_s = restart_gap_s  # answer audio after this long without any restarts playback
        self._arrival = asyncio.Event()  # set by each microphone arrival (``align_start`` waits on it)
        self.gap_s = gap_s
        self.max_ahead_s = max_ahead_s
        self.mic_arrived = queued_samples  # microphone samples arrived (queued ones count: fed first)
        self._playing_until = 0  # the clock at which the audio sent so far ends, played back to back
        self._decoders: dict[int, PcmStreamDecoder] = {}  # answer audio (PCM16 mono) per rate → 16 kHz
        # Gaps in the microphone audio (``gap``): (clock sample where each began, its length), applied
        # to the canceller when its audio reaches them (the worker feeds what the reader queued).
        self._gaps: deque[tuple[int, int]] = deque()
        self._watch_gaps = watch_gaps  # find them by the wall clock (the WebSockets: no timestamps)
        self._last_arrival: tuple[float, float] | None = None  # (monotonic, seconds of audio) of the latest
        self.streamed_ahead_s = streamed_ahead_s  # audio this far ahead of the wall clock is a file (``auto``)
        self._first_arrival: float | None = None  # monotonic: how far ahead of real time the audio came
        self._heard = 0  # microphone samples arrived, gaps not counted
        self._retractable = 0  # samples of the latest gap that audio coming in a burst may show were held up
        # Monotonic time of the first answer audio sent before any microphone audio came (it plays from
        # then: the clock's ``mic_arrived`` sample is that moment, until the microphone says otherwise).
        self._sent_first_at: float | None = None
        self._first_gap = False  # the gap queued is the first audio's (``arrived``): skipped at once

    @classmethod
    def of(cls, settings: Settings, queued_samples: int = 0, *, watch_gaps: bool = True) -> EchoLine:
        """A stream's line with the operator's settings: ``echo_mic_gap_ms``, ``echo_max_ahead_s``,
        ``echo_auto_streamed_ahead_s``."""
        return cls(
            queued_samples,
            watch_gaps=watch_gaps,
            gap_s=settings.echo_mic_gap_ms / 1000.0,
            max_ahead_s=settings.echo_max_ahead_s,
            streamed_ahead_s=settings.echo_auto_streamed_ahead_s,
            align_wait_s=settings.echo_align_wait_ms / 1000.0,
            restart_gap_s=settings.echo_speech_gate_onset_gap_ms / 1000.0,
            tracker=DelayTracker.of(settings),
            residual_max_ms=(
                settings.echo_delay_track_max_ms
                if (settings.echo_speech_gate_residual > 0 or settings.echo_speech_gate_residual_suspect > 0)
                and settings.echo_speech_gate_db > 0
                else None
            ),
        )

    def set_mode(self, mode: EchoMode, settings: Settings) -> None:
        """``auto``: the canceller's output only where the microphone carries the echo
        (audio/echo_presence.py); ``on``: always. A change of mode starts the decision afresh."""
        self.canceller.hold_undecided_samples = settings.echo_auto_hold_ms * SAMPLE_RATE_HZ // 1000
        if mode != "auto":
            self.canceller.detect = None
        elif self.canceller.detect is None:
            self.canceller.detect = EchoPresence(
                settings.echo_auto_echo_likeness,
                settings.echo_auto_quiet_likeness,
                settings.echo_auto_min_sound_s,
                settings.echo_auto_min_compared_s,
            )

    def arrived(self, samples: int) -> None:
        """Microphone audio came (the reader's view). With ``watch_gaps``, audio that comes
        ``gap_s`` later than the audio before it ends (a device that stops sending while it
        plays an answer) marks a gap of that long: the device's clock went on meanwhile.

        Audio that was only held up on its way (the server's loop or the client busy for a second:
        a loaded machine) comes late too, and then in a burst, faster than real time: what the
        burst brings of the gap's time is taken back from the gap while the canceller has not
        reached it, or the clock would run that far ahead of the device's for the rest of the
        stream (the answers placed late: their echo uncancelled, at every answer's start). The
        canceller skips a gap only once its size is known (``process``: a piece after it in real
        time, or the burst over), so a worker that cleans each piece as it comes does not skip the
        time the burst takes back."""
        now = time.monotonic()
        if self._watch_gaps and self._last_arrival is None and self._sent_first_at is not None:
            # The first microphone audio, after answers went out (a client that sends it only while
            # its user speaks): the device's clock ran from the first answer on, not from here. A
            # gap of any length (there is no audio before it to be late after). Placed by when it
            # arrived, it is late by its time on the way, so its echo comes later than its reference
            # (a delay the canceller finds), never before it. Audio sent in a burst takes back what
            # it brings of the gap (as below), and the worker skips this gap at once, not after the
            # next piece: a question appended in one piece is cleaned where it was said.
            silent_s = now - self._sent_first_at - samples / SAMPLE_RATE_HZ
            if silent_s > 0:
                self._retractable = round(silent_s * SAMPLE_RATE_HZ)
                self.gap(self._retractable)
                self._first_gap = True
        if self._watch_gaps and self._last_arrival is not None:
            last_at, last_s = self._last_arrival
            silent_s = now - last_at - last_s
            if silent_s >= self.gap_s:
                self._retractable = round(silent_s * SAMPLE_RATE_HZ)
                self.gap(self._retractable)
            elif self._retractable and silent_s < -last_s / 2:  # it had waited on its way: a burst
                self._retract(min(self._retractable, round(-silent_s * SAMPLE_RATE_HZ)))
            else:
                self._retractable = 0  # in real time again: what is left of the gap was one
        self._last_arrival = (now, samples / SAMPLE_RATE_HZ)
        self._arrival.set()
        if self._first_arrival is None:
            self._first_arrival = now
        self.mic_arrived += samples
        self._heard += samples
        # (Gaps not counted: audio held up and then sent in a burst is in real time over the whole.)
        ahead_s = self._heard / SAMPLE_RATE_HZ - (now - self._first_arrival)
        detect = self.canceller.detect
        if detect is not None and not detect.streamed and ahead_s > self.streamed_ahead_s:
            detect.stream()  # faster than real time: not a microphone by a loudspeaker

    def gap(self, samples: int) -> None:
        """No microphone audio came for ``samples``: the clock moves on (``EchoCanceller.skip``,
        once the audio before it has been cleaned)."""
        if samples > 0:
            self._gaps.append((self.mic_arrived, samples))
            self.mic_arrived += samples

    def _retract(self, samples: int) -> None:
        """``samples`` of the latest gap were audio held up, not missing: the gap shrinks by that
        much, while the canceller has not skipped it yet (once it has, the clock stays)."""
        if not self._gaps or samples <= 0:
            self._retractable = 0
            return
        start, length = self._gaps[-1]
        taken = min(samples, length)
        if taken == length:
            self._gaps.pop()
        else:
            self._gaps[-1] = (start, length - taken)
        self.mic_arrived -= taken
        self._retractable -= taken

    async def align_start(self) -> None:
        """Answer audio is about to go out. Where the device has played all it was sent, it plays
        this from when it arrives: at a moment ``sent`` can only place at the microphone audio
        arrived so far, up to a frame early (a device that plays and records in the same frames
        starts it at its next frame). Placed 0 or 20 ms off at random, two answers give the
        canceller two echo delays, and it lets the next answer's first syllable through while it
        finds the new one (tools/README.md: echo_align). So wait for the microphone's next audio,
        and send right after it: the device then plays it from the frame it is recording now. Not
        longer than ``align_wait_s`` (``echo_align_wait_ms``; 0: never), nor for a microphone whose
        frames are longer than that or that is late (one sending nothing while it plays)."""
        if self.align_wait_s <= 0 or self._last_arrival is None or self._playing_until > self.mic_arrived:
            return  # (the device is still playing what came before: this follows it back to back)
        last_at, last_s = self._last_arrival
        if last_s > self.align_wait_s:
            return
        # The next frame is due ``last_s`` after the latest; one late (a busy device or server) is
        # waited for all the same, up to the limit past when it was due.
        wait_s = min(last_at + last_s + self.align_wait_s - time.monotonic(), self.align_wait_s)
        if wait_s <= 0:
            return  # long overdue: a microphone that is not sending now
        self._arrival.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self._arrival.wait()

    def sent(self, pcm16: bytes, rate_hz: int, *, louder: bool = False) -> int:
        """Answer audio (little-endian PCM16 mono at ``rate_hz``) went to the device: it is the
        reference from where it will play. Returns that sample of the stream clock. ``louder``: it
        plays as written again after a duck (``AudioOut.rose``): its echo's onset is marked as a
        playback restart's is, where the canceller may leak."""
        decoder = self._decoders.get(rate_hz)
        if decoder is None:
            decoder = self._decoders[rate_hz] = PcmStreamDecoder(PcmFormat(rate_hz, 16, 1), carry_partial=True)
        samples = decoder.decode(pcm16)
        clock = self.mic_arrived  # where the device is now
        if self._watch_gaps and self._last_arrival is None:
            # No microphone audio yet: the device's clock is the wall clock since the first answer
            # went out (an answer sent 10 s after the first plays 10 s into it) ...
            now = time.monotonic()
            if self._sent_first_at is None:
                self._sent_first_at = now
            clock += round((now - self._sent_first_at) * SAMPLE_RATE_HZ)
            if clock - self.mic_arrived > self.max_ahead_s * SAMPLE_RATE_HZ:
                # ... for ``max_ahead_s`` (a client that only listens): then the clock starts again
                # here, and what was placed ahead is no reference (the canceller holds a bounded
                # stretch ahead of the microphone).
                self._sent_first_at = now
                self.cut(self.mic_arrived)
                clock = self.mic_arrived
        if self._playing_until - clock > self.max_ahead_s * SAMPLE_RATE_HZ:
            # The microphone has sent nothing for that long (a half-duplex client, a text-only one):
            # its clock says nothing of when this plays. From now, rather than ever further ahead.
            self._playing_until = clock
        at = max(clock, self._playing_until)
        if louder or self._playing_until == 0 or at - self._playing_until >= self.restart_gap_s * SAMPLE_RATE_HZ:
            self.canceller.restarted(at)  # after a stretch without answer audio, or a duck: the canceller may leak
        self.canceller.played(samples, at_sample=at)
        self._playing_until = at + samples.size
        return at

    def cut(self, at_sample: int) -> None:
        """The device stopped playing at ``at_sample`` (an answer truncated): the rest was not played."""
        self.canceller.cut(at_sample)
        self._playing_until = min(self._playing_until, at_sample)

    def process(self, mic16k: AudioArray) -> AudioArray:
        while self._gaps and self._gaps[0][0] <= self.canceller.position:
            if len(self._gaps) == 1 and self._retractable and not self._first_gap:
                break  # the latest gap's size is not known yet (a burst may take it back): the next piece says
            self.canceller.skip(self._gaps.popleft()[1])
            self._first_gap = False
        return self.canceller.process(mic16k)

    def release(self) -> AudioArray:
        """The microphone audio waiting for ``auto``'s decision, now (a commit, a stop, a sender that
        stopped sending: what was said is in the utterance), auto deciding on what it has
        (``EchoCanceller.release``)."""
        return self.canceller.release(settle=True)

    def removed_db(self, from_ms_ago: int, to_ms_ago: int) -> float | None:
        return self.canceller.removed_db(from_ms_ago, to_ms_ago)


class HeldRelease:
    """Audio the canceller holds for ``auto``'s decision (``EchoCanceller._hold``) goes out only with
    more audio, or at a commit or stop: a sender that stops sending (an app that appends only while
    its user speaks, Opus DTX) would leave it held, its speech unheard until whenever audio came
    next (a review). Once no audio has been processed for ``wait_s`` while some is held,
    ``release`` is called (the transport hears the held audio, in order with its other work)."""

    def __init__(self, wait_s: float, release: Callable[[], None]) -> None:
        self.wait_s = wait_s
        self._release = release
        self._fed_at = 0.0
        self._task: asyncio.Task[None] | None = None

    def fed(self, line: EchoLine | None) -> None:
        """A piece of audio went through ``line``'s canceller."""
        self._fed_at = time.monotonic()
        if line is not None and line.canceller.holding and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(line), name="echo-held-release")

    async def _watch(self, line: EchoLine) -> None:
        try:
            while line.canceller.holding:
                fed_at = self._fed_at
                await asyncio.sleep(self.wait_s)
                if self._fed_at == fed_at and line.canceller.holding:
                    self._release()
                    return
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

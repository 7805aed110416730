"""A push-to-talk recording's audio, bounded by ``stream_max_recording_s`` (``StreamSession``).

Split from stream/session.py: the recording's chunks, their length and whether the bound was
reached were three fields of the session, reset together in three places.
"""

from __future__ import annotations

import numpy as np

from mediaserver.events import SAMPLE_RATE_HZ, AudioArray


class Recording:
    """The audio of one push-to-talk recording, at most ``max_s`` seconds of it."""

    def __init__(self, max_s: float) -> None:
        self.max_s = max_s
        self.max_samples = int(max_s * SAMPLE_RATE_HZ)
        self.reset()

    def reset(self) -> None:
        self._chunks: list[AudioArray] = []
        self.samples = 0  # kept so far (``audio`` is that long)
        self.capped = False  # audio past the bound was dropped

    def keep(self, samples: AudioArray) -> tuple[int, bool]:
        """Keep what fits: (the samples kept, whether this is the first time audio was dropped)."""
        room = self.max_samples - self.samples
        first_drop = False
        if samples.size > room:
            first_drop, self.capped = not self.capped, True
            samples = samples[: max(0, room)]
        if samples.size:
            self._chunks.append(samples)
            self.samples += samples.size
        return samples.size, first_drop

    def audio(self) -> AudioArray:
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)

    def too_long(self) -> str:
        """The error a recording past the bound gets (once)."""
        return (
            f"the recording is longer than stream_max_recording_s ({self.max_s:g} s): the audio after that is"
            " dropped, and the recording's transcript (at its stop or commit) is of what was kept"
        )

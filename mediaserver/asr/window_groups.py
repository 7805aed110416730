"""A transcript's segments grouped by the decoder pass (window) that produced them.

The loop guards judge a long upload window by window: a decoder loop happens inside one pass of at
most 30 s, while a person may say the same sentence over minutes. ``Segment.seek`` names the window
(its start, in Whisper's 10 ms frames), as in Whisper's own output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from mediaserver.events import Segment


@dataclass(frozen=True)
class WindowGroup:
    """The segments of a transcript that one decoder pass produced, and the stretch of audio it
    stands for: from its first segment's start to the next group's (the job's start and end at
    the ends), so every second of the job belongs to exactly one group."""

    start_s: float
    end_s: float
    segments: tuple[Segment, ...]

    @property
    def text(self) -> str:
        return "".join(seg.text for seg in self.segments)

    def shifted(self, by_s: float) -> tuple[Segment, ...]:
        return shift_segments(self.segments, by_s)


def window_groups(segments: Sequence[Segment], duration_s: float) -> list[WindowGroup]:
    """A transcript's segments grouped by the window they were decoded in (``Segment.seek``)."""
    by_seek: dict[int, list[Segment]] = {}
    for seg in segments:
        by_seek.setdefault(seg.seek, []).append(seg)
    ordered = sorted(by_seek.values(), key=lambda group: min(seg.start_s for seg in group))
    starts = [0.0] + [min(seg.start_s for seg in group) for group in ordered[1:]]
    ends = [*starts[1:], duration_s]
    return [
        WindowGroup(start, max(start, end), tuple(group))
        for start, end, group in zip(starts, ends, ordered, strict=True)
    ]


def shift_segments(segments: Sequence[Segment], by_s: float) -> tuple[Segment, ...]:
    return tuple(
        replace(
            seg,
            start_s=max(0.0, seg.start_s + by_s),
            end_s=max(0.0, seg.end_s + by_s),
            seek=max(0, seg.seek + round(by_s * 100)),
            words=tuple(replace(w, start_s=w.start_s + by_s, end_s=w.end_s + by_s) for w in seg.words),
        )
        for seg in segments
    )

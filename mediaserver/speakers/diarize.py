"""Who spoke when: speaker turns of a recording, on the speaker encoder (encoder.py), numpy only.

1. Voiced regions: webrtcvad (aggressiveness 3, 30 ms frames); pauses shorter than
   ``MIN_PAUSE_S`` are bridged, voiced bits shorter than ``MIN_REGION_S`` dropped.
2. Windows of ``WINDOW_S`` every ``HOP_S`` inside each region (a region shorter than a window is
   one window of its own length) are embedded on the speaker service's worker thread; a window with
   too little speech for the encoder (under 1.2 s once silences are cut) has no vector.
3. The vectors are clustered without being told how many speakers there are: agglomerative, average
   linkage on cosine similarity, merging while the two closest clusters' mean similarity is at least
   ``diarize_cluster_threshold``.
4. Each window owns the stretch nearest its centre; a region without a vector takes the label of the
   nearest window. Consecutive stretches of one label make a turn; a turn shorter than
   ``MIN_TURN_S`` between two turns of one speaker joins them.
5. Known speakers (OpenAI's ``known_speaker_names[]``): a cluster takes the name of the reference
   most like its centroid, at ``speaker_threshold`` or more, each name once; the other clusters are
   ``A``, ``B``, ... in the order they first speak.
6. A recording with too little speech for any vector (a short command, silence) is one turn of
   ``A`` over the whole of it: its words are still transcribed.

Long recordings widen the hop so that at most ``MAX_WINDOWS`` windows are clustered (the clustering
costs windows³).
"""

from __future__ import annotations

import asyncio
import string
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mediaserver.audio.vad import speech_flags
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray

FRAME_MS = 30
MIN_PAUSE_S = 0.3
MIN_REGION_S = 0.2
WINDOW_S = 1.5
HOP_S = 0.75
MIN_TURN_S = 1.0
MAX_WINDOWS = 1200

Vectors = npt.NDArray[np.float32]
EmbedWindows = Callable[[list[AudioArray]], Awaitable[list[Vectors | None]]]


@dataclass(frozen=True)
class Turn:
    """One speaker's stretch of the recording, in seconds; ``speaker`` is a cluster index until
    :func:`name_clusters` gives it a label."""

    start_s: float
    end_s: float
    speaker: int


def voiced_regions(audio: AudioArray) -> list[tuple[float, float]]:
    """(start, end) seconds of speech, pauses under ``MIN_PAUSE_S`` bridged."""
    flags = speech_flags(audio, aggressiveness=3, frame_ms=FRAME_MS)
    frame_s = FRAME_MS / 1000
    regions: list[tuple[float, float]] = []
    start: int | None = None
    for i, voiced in enumerate([*flags, False]):
        if voiced and start is None:
            start = i
        elif not voiced and start is not None:
            regions.append((start * frame_s, i * frame_s))
            start = None
    bridged: list[tuple[float, float]] = []
    for s, e in regions:
        if bridged and s - bridged[-1][1] < MIN_PAUSE_S:
            bridged[-1] = (bridged[-1][0], e)
        else:
            bridged.append((s, e))
    return [(s, e) for s, e in bridged if e - s >= MIN_REGION_S]


def windows(regions: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The embedding windows over ``regions``: ``WINDOW_S`` long every hop, the last ending at the
    region's end; the hop widens so that there are at most ``MAX_WINDOWS``."""
    voiced = sum(e - s for s, e in regions)
    hop = max(HOP_S, voiced / MAX_WINDOWS)
    found: list[tuple[float, float]] = []
    for s, e in regions:
        if e - s <= WINDOW_S:
            found.append((s, e))
            continue
        count = int(np.ceil((e - s - WINDOW_S) / hop)) + 1
        starts = np.linspace(s, e - WINDOW_S, count)
        found.extend((float(a), float(a) + WINDOW_S) for a in starts)
    return found


def cluster(vectors: Vectors, threshold: float) -> npt.NDArray[np.int64]:
    """Agglomerative clustering (average linkage, cosine similarity of unit vectors) that stops when
    no two clusters are at least ``threshold`` alike on average. Labels 0, 1, ... in order of first
    appearance."""
    n = len(vectors)
    if n == 0:
        return np.zeros(0, np.int64)
    sums = (vectors @ vectors.T).astype(np.float64)  # sums[a, b]: similarity summed over pairs
    sizes = np.ones(n)
    alive = np.ones(n, bool)
    members: list[list[int]] = [[i] for i in range(n)]
    while alive.sum() > 1:
        mean = sums / np.outer(sizes, sizes)
        mean[~alive, :] = -np.inf
        mean[:, ~alive] = -np.inf
        np.fill_diagonal(mean, -np.inf)
        a, b = np.unravel_index(int(np.argmax(mean)), mean.shape)
        if mean[a, b] < threshold:
            break
        sums[a, :] += sums[b, :]
        sums[:, a] += sums[:, b]
        sizes[a] += sizes[b]
        alive[b] = False
        members[a] += members[b]
        members[b] = []
    labels = np.empty(n, np.int64)
    groups = sorted((sorted(m) for m in members if m), key=lambda m: m[0])
    for label, group in enumerate(groups):
        labels[group] = label
    return labels


def turns(
    regions: Sequence[tuple[float, float]], spans: Sequence[tuple[float, float]], labels: Sequence[int | None]
) -> list[Turn]:
    """Speaker turns from labelled windows (``None``: no vector); see the module's step 4."""
    known = [(0.5 * (s + e), label) for (s, e), label in zip(spans, labels, strict=True) if label is not None]
    if not known:
        return []
    centres = np.array([c for c, _ in known])
    pieces: list[Turn] = []
    for s, e in regions:
        inside = [(c, label) for c, label in known if s <= c <= e]
        if not inside:  # no usable window here: the nearest one's speaker
            nearest = known[int(np.argmin(np.abs(centres - 0.5 * (s + e))))][1]
            pieces.append(Turn(s, e, nearest))
            continue
        edge = s
        for k, (c, label) in enumerate(inside):
            end = e if k == len(inside) - 1 else 0.5 * (c + inside[k + 1][0])
            pieces.append(Turn(edge, end, label))
            edge = end
    return smooth(_join(pieces))


def _join(pieces: list[Turn]) -> list[Turn]:
    joined: list[Turn] = []
    for piece in pieces:
        if joined and joined[-1].speaker == piece.speaker:
            joined[-1] = Turn(joined[-1].start_s, piece.end_s, piece.speaker)
        else:
            joined.append(piece)
    return joined


def smooth(found: list[Turn]) -> list[Turn]:
    """A turn shorter than ``MIN_TURN_S`` between two turns of one speaker becomes theirs."""
    result = list(found)
    changed = True
    while changed:
        changed = False
        for i in range(1, len(result) - 1):
            before, turn, after = result[i - 1], result[i], result[i + 1]
            if turn.end_s - turn.start_s < MIN_TURN_S and before.speaker == after.speaker:
                result[i - 1 : i + 2] = [Turn(before.start_s, after.end_s, before.speaker)]
                changed = True
                break
    return result


def letters(index: int) -> str:
    """OpenAI's labels for unknown speakers: A, B, ..., Z, AA, AB, ..."""
    label = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        label = string.ascii_uppercase[rest] + label
    return label


def name_clusters(
    found: list[Turn],
    vectors: Vectors,
    labels: npt.NDArray[np.int64],
    references: Sequence[tuple[str, Vectors]],
    threshold: float,
) -> dict[int, str]:
    """Each cluster's label: a known speaker's name (see the module's step 5) or a letter."""
    clusters = sorted({t.speaker for t in found}, key=lambda c: next(t.start_s for t in found if t.speaker == c))
    names: dict[int, str] = {}
    if references and clusters:
        centroids = np.stack([vectors[labels == c].mean(axis=0) for c in clusters])
        centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
        scores = np.stack([ref for _, ref in references]) @ centroids.T
        while np.isfinite(scores).any():
            best = np.unravel_index(int(np.argmax(scores)), scores.shape)
            r, k = int(best[0]), int(best[1])
            if scores[r, k] < threshold:
                break
            names[clusters[k]] = references[r][0]
            scores[r, :] = -np.inf
            scores[:, k] = -np.inf
    taken = set(names.values())
    next_letter = 0
    for c in clusters:
        if c in names:
            continue
        while letters(next_letter) in taken:
            next_letter += 1
        names[c] = letters(next_letter)
        next_letter += 1
    return names


@dataclass(frozen=True)
class SpeakerTurn:
    start_s: float
    end_s: float
    speaker: str


async def diarize(
    embed_windows: EmbedWindows,
    audio: AudioArray,
    *,
    cluster_threshold: float,
    references: Sequence[tuple[str, Vectors]] = (),
    name_threshold: float = 0.75,
) -> list[SpeakerTurn]:
    """The speaker turns of ``audio``. ``embed_windows`` is the speaker service's
    :meth:`~mediaserver.speakers.service.SpeakerService.embed_windows`."""
    regions = await asyncio.to_thread(voiced_regions, audio)
    spans = windows(regions)
    clips = [audio[int(s * SAMPLE_RATE_HZ) : int(e * SAMPLE_RATE_HZ)] for s, e in spans]
    embedded = await embed_windows(clips)
    usable = [(i, v) for i, v in enumerate(embedded) if v is not None]
    if not usable:
        # Too little speech for the encoder anywhere (a short command: a trial's 1.4 s "Turn on the
        # kitchen lights." came back with no text at all): one speaker, over the whole recording;
        # the ASR decides whether anyone spoke.
        return [SpeakerTurn(0.0, audio.size / SAMPLE_RATE_HZ, letters(0))]
    vectors = np.stack([v for _, v in usable])
    labels = await asyncio.to_thread(cluster, vectors, cluster_threshold)
    by_window: list[int | None] = [None] * len(spans)
    for (i, _), label in zip(usable, labels, strict=True):
        by_window[i] = int(label)
    found = turns(regions, spans, by_window)
    names = name_clusters(found, vectors, labels, references, name_threshold)
    return [SpeakerTurn(t.start_s, t.end_s, names[t.speaker]) for t in found]

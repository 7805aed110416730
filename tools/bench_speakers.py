#!/usr/bin/env python3
"""Speaker verification with the server's speaker model (GE2E, or the ONNX file
``MEDIASERVER_SPEAKER_MODEL_PATH`` names): how often a voice is let in or kept out.

Real multi-clip speakers are scarce on the package registries. The figures rest on the suite's
real recordings (tests/human_speech.py):

* **genuine speakers** (several clips each): the LibriVox reader (5 clips, 25 s), JFK (his 11 s
  clip cut at its pauses into 3 parts: one recording, so optimistic), and the "feels like these
  days go on forever" speaker (2 clips);
* **impostors**: every other speaker's clips: the two CMU ARCTIC voices (awb, slt), the card
  commands' speaker, Piper's voice read at three speeds (a synthetic voice, as a replayed or
  generated voice would be), and six espeak-ng formant voices at their own pitch and speed (when
  espeak-ng is installed: ``apt-get install espeak-ng``).

Each genuine speaker is enrolled from 1 clip and from 3 clips (all choices; as the server enrols:
the clips' embeddings weighted by their seconds of speech) and tested on their other clips
(genuine trials) and on every clip of everyone else (impostor trials). Printed: the equal error
rate (EER), and the false-accept and false-reject rates at ``--threshold`` (the server's
``speaker_threshold``) and at a few others; the cost of one embedding alone and batched, and the
encoder's memory. ``--plot`` writes the score distributions.

**Diarization** (mediaserver/speakers/diarize.py, the server's own ``diarize``, on a real
``SpeakerService``): ``--recordings`` seeded random concatenations of 2 or 3 of 7 voices (the
reader, JFK, awb, slt, the card-command speaker, the "forever" speaker and Piper), each speaker's
clips trimmed of leading and trailing silence and put end to end, turns of 1-10 s cut from them (as
long as a voice's clips allow), 0-0.5 s of silence between turns, no one twice in a row. Scored on
a 10 ms grid with a 0.25 s collar around every reference boundary (standard practice) and the best
one-to-one mapping of the hypothesis' labels onto the speakers: DER (missed speech, false alarm,
speaker confusion) over the reference speech, and the speaker-count error (hypothesis speakers minus
reference speakers), side by side for each of ``--diarize-thresholds``
(``diarize_cluster_threshold``). ``--diarize-plot`` writes DER per threshold.

    python tools/bench_speakers.py [--threshold 0.75] [--plot docs/bench-speakers.png]
        [--part both|verify|diarize] [--recordings 30] [--seed 36]
        [--diarize-thresholds 0.55,0.65,0.75] [--diarize-plot docs/bench-diarize.png]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import resource
import shutil
import subprocess
import sys
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mediaserver.config import Settings
from mediaserver.speakers.encoder import voiced_seconds
from mediaserver.speakers.service import _load_encoder, model_path
from tests.human_speech import default_dir as speech_dir
from tests.human_speech import load_clips

GENUINE = {
    "reader": ["librivox_0870", "librivox_0880", "librivox_0890", "librivox_0920", "librivox_0930"],
    "forever": ["forever_2", "forever_4"],
}
JFK_CUTS_S = [(0.0, 3.2), (3.2, 6.8), (6.8, 11.0)]  # at his pauses
OTHER_REAL = ["arctic_a0007", "arctic_a0009", "cards_002", "cards_003", "cards_004", "cards_005", "goforward"]
PIPER_TEXTS = [
    "Turn on the kitchen lights and close the garage door.",
    "What is the weather like in Paris this afternoon?",
    "Please remind me to call my mother tomorrow morning.",
]


# espeak-ng's formant voices (apt-get install espeak-ng; skipped when it is not there): synthetic
# impostors unlike Piper's neural voice, at their own pitch (-p) and speed (-s).
ESPEAK_VOICES = [
    ("en-us+m1", 40, 150),
    ("en-us+m3", 55, 170),
    ("en+m7", 30, 160),
    ("en-us+f2", 60, 160),
    ("en+f4", 75, 150),
    ("en-us+klatt", 50, 175),
]


@dataclass(frozen=True)
class Voice:
    speaker: str
    name: str
    audio: np.ndarray


def voices() -> list[Voice]:
    clips = {name: audio for name, audio, _ in load_clips(speech_dir())}
    result = [Voice(speaker, name, clips[name]) for speaker, names in GENUINE.items() for name in names]
    result += [
        Voice("jfk", f"jfk_{n}", clips["jfk"][int(a * 16000) : int(b * 16000)]) for n, (a, b) in enumerate(JFK_CUTS_S)
    ]
    result += [Voice(name, name, clips[name]) for name in OTHER_REAL]
    from piper import SynthesisConfig

    from mediaserver.audio.decode import resample_mono
    from tests.conftest import _voice

    piper = _voice()
    for n, (text, speed) in enumerate(zip(PIPER_TEXTS, (0.85, 1.0, 1.2), strict=True)):
        config = SynthesisConfig(length_scale=speed)
        pcm = np.concatenate([c.audio_int16_array for c in piper.synthesize(text, syn_config=config)])
        audio = resample_mono(pcm.astype(np.float32) / 32768.0, 22050)
        result.append(Voice("piper", f"piper_{n}", audio))
    return result + espeak_voices()


def espeak_voices() -> list[Voice]:
    """Each espeak-ng voice of ``ESPEAK_VOICES`` reading one of ``PIPER_TEXTS`` (none without espeak-ng)."""
    binary = shutil.which("espeak-ng")
    if binary is None:
        print("espeak-ng is not installed: its synthetic impostors are left out (apt-get install espeak-ng)")
        return []
    from mediaserver.audio.decode import resample_mono

    result = []
    for n, (voice, pitch, speed) in enumerate(ESPEAK_VOICES):
        text = PIPER_TEXTS[n % len(PIPER_TEXTS)]
        command = [binary, "-v", voice, "-p", str(pitch), "-s", str(speed), "--stdout", text]
        wav = subprocess.run(command, check=True, capture_output=True).stdout
        with wave.open(io.BytesIO(wav)) as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0
        result.append(Voice(f"espeak-{voice}", f"espeak_{voice}", resample_mono(pcm, rate)))
    return result


def enrolment(vectors: list[np.ndarray], seconds: list[float]) -> np.ndarray:
    mean = np.mean([v * s for v, s in zip(vectors, seconds, strict=True)], axis=0)
    result: np.ndarray = mean / np.linalg.norm(mean)
    return result


def rates(genuine: np.ndarray, impostor: np.ndarray, threshold: float) -> tuple[float, float]:
    """(false accepts among impostor trials, false rejects among genuine trials) at ``threshold``."""
    return float(np.mean(impostor >= threshold)), float(np.mean(genuine < threshold))


def eer(genuine: np.ndarray, impostor: np.ndarray) -> tuple[float, float]:
    """The equal error rate and the threshold it is reached at."""
    best = (1.0, 0.0)
    for threshold in np.linspace(0.3, 1.0, 701):
        far, frr = rates(genuine, impostor, float(threshold))
        if abs(far - frr) < abs(best[0] - best[1]) or best == (1.0, 0.0):
            best = (far, frr)
            at = float(threshold)
    return (best[0] + best[1]) / 2, at


# --- diarization (issue #36: "concatenations of 2-3 real speakers with turns of 1-10 s") ---------

DIARIZE_SPEAKERS = {
    "reader": GENUINE["reader"],
    "jfk": ["jfk"],
    "awb": ["arctic_a0007"],
    "slt": ["arctic_a0009"],
    "cards": ["cards_001", "cards_002", "cards_003", "cards_004", "cards_005"],
    "forever": GENUINE["forever"],
}
DIARIZE_PIPER_TEXTS = [
    *PIPER_TEXTS,
    "The library closes at eight, so bring the books back before then.",
    "I would like a large coffee with oat milk and no sugar, please.",
]
GRID_S = 0.01
COLLAR_S = 0.25


@dataclass(frozen=True)
class Recording:
    audio: np.ndarray
    truth: list[tuple[float, float, str]]  # (start s, end s, speaker) per turn

    @property
    def speakers(self) -> set[str]:
        return {s for _, _, s in self.truth}


def speaker_streams() -> dict[str, np.ndarray]:
    """Each diarization speaker's clips, leading and trailing silence trimmed, end to end."""
    from tests.conftest import synthesize
    from tests.human_speech import voiced_span

    clips = {name: audio for name, audio, _ in load_clips(speech_dir())}
    per_speaker = {speaker: [clips[n] for n in names] for speaker, names in DIARIZE_SPEAKERS.items()}
    per_speaker["piper"] = [synthesize(text).audio16k for text in DIARIZE_PIPER_TEXTS]
    streams = {}
    for speaker, audios in per_speaker.items():
        trimmed = []
        for audio in audios:
            a, b = voiced_span(audio)
            trimmed.append(audio[a:b])
        streams[speaker] = np.concatenate(trimmed).astype(np.float32)
    return streams


def make_recording(rng: np.random.Generator, streams: dict[str, np.ndarray], n_speakers: int) -> Recording:
    """2 or 3 speakers taking turns (never one twice in a row) of 1-10 s cut from their streams (as
    long as a speaker's stream allows), 0-0.5 s of silence between turns; every speaker speaks."""
    from tests.human_speech import voiced_span

    chosen = [str(s) for s in rng.choice(sorted(streams), size=n_speakers, replace=False)]
    order = list(chosen)  # everyone once first, then at random
    for _ in range(int(rng.integers(2, 5))):
        order.append(str(rng.choice([s for s in chosen if s != order[-1]])))
    pieces: list[np.ndarray] = []
    truth: list[tuple[float, float, str]] = []
    at = 0
    for speaker in order:
        stream = streams[speaker]
        length = min(int(rng.uniform(1.0, 10.0) * 16000), stream.size)
        first = int(rng.integers(0, stream.size - length + 1))
        cut = stream[first : first + length]
        try:
            a, b = voiced_span(cut)
        except ValueError:
            a, b = 0, cut.size
        if b - a < 16000:  # cut mostly a pause: keep the whole cut
            a, b = 0, cut.size
        cut = cut[a:b]
        gap = np.zeros(int(rng.uniform(0.0, 0.5) * 16000), np.float32)
        pieces += [gap, cut]
        at += gap.size
        truth.append((at / 16000, (at + cut.size) / 16000, speaker))
        at += cut.size
    pieces.append(np.zeros(int(0.3 * 16000), np.float32))
    return Recording(np.concatenate(pieces), truth)


@dataclass
class Score:
    speech: float = 0.0  # scored reference speech, s
    missed: float = 0.0
    false_alarm: float = 0.0
    confusion: float = 0.0

    def add(self, other: Score) -> None:
        self.speech += other.speech
        self.missed += other.missed
        self.false_alarm += other.false_alarm
        self.confusion += other.confusion

    @property
    def der(self) -> float:
        return (self.missed + self.false_alarm + self.confusion) / self.speech if self.speech else 0.0


def score(truth: list[tuple[float, float, str]], hypothesis: list[tuple[float, float, str]], duration: float) -> Score:
    """DER's parts on a ``GRID_S`` grid, frames within ``COLLAR_S`` of a reference boundary not scored,
    hypothesis labels mapped one to one onto reference speakers as best they can be."""
    frames = int(np.ceil(duration / GRID_S))
    times = (np.arange(frames) + 0.5) * GRID_S
    refs = sorted({s for _, _, s in truth})
    hyps = sorted({s for _, _, s in hypothesis})
    ref = np.full(frames, -1)
    scored = np.ones(frames, bool)
    for start, end, speaker in truth:
        ref[(times >= start) & (times < end)] = refs.index(speaker)
        for edge in (start, end):
            scored &= np.abs(times - edge) > COLLAR_S
    hyp = np.full(frames, -1)
    for start, end, speaker in hypothesis:
        hyp[(times >= start) & (times < end)] = hyps.index(speaker)
    ref, hyp = ref[scored], hyp[scored]
    both = (ref >= 0) & (hyp >= 0)
    overlap = np.zeros((len(refs), len(hyps)))
    np.add.at(overlap, (ref[both], hyp[both]), 1)
    best = 0.0  # the most jointly labelled frames any one-to-one mapping gives
    for assignment in itertools.permutations([*range(len(hyps)), *[None] * len(refs)], len(refs)):
        best = max(best, sum(overlap[r, h] for r, h in enumerate(assignment) if h is not None))
    return Score(
        speech=float(np.sum(ref >= 0)) * GRID_S,
        missed=float(np.sum((ref >= 0) & (hyp < 0))) * GRID_S,
        false_alarm=float(np.sum((ref < 0) & (hyp >= 0))) * GRID_S,
        confusion=float(np.sum(both) - best) * GRID_S,
    )


@dataclass
class DiarizeResult:
    threshold: float
    total: Score
    by_speakers: dict[int, Score]
    count_errors: list[int]  # hypothesis speakers minus reference speakers, per recording
    seconds: float  # diarizing
    audio_s: float


async def diarize_all(recordings: list[Recording], thresholds: list[float]) -> list[DiarizeResult]:
    import tempfile

    from mediaserver.speakers.diarize import diarize
    from mediaserver.speakers.service import SpeakerService

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        service = SpeakerService(Settings(_env_file=None, speakers_dir=Path(tmp)))
        await service.start()
        try:
            if service.weights is None:
                raise SystemExit(f"speakers are off: {service.problem}")
            for threshold in thresholds:
                result = DiarizeResult(threshold, Score(), {2: Score(), 3: Score()}, [], 0.0, 0.0)
                for recording in recordings:
                    started = time.perf_counter()
                    found = await diarize(service.embed_windows, recording.audio, cluster_threshold=threshold)
                    result.seconds += time.perf_counter() - started
                    duration = recording.audio.size / 16000
                    result.audio_s += duration
                    hypothesis = [(t.start_s, t.end_s, t.speaker) for t in found]
                    one = score(recording.truth, hypothesis, duration)
                    result.total.add(one)
                    result.by_speakers[len(recording.speakers)].add(one)
                    result.count_errors.append(len({t.speaker for t in found}) - len(recording.speakers))
                results.append(result)
        finally:
            await service.aclose()
    return results


def too_many_few(result: DiarizeResult) -> str:
    return f"{sum(e > 0 for e in result.count_errors)} / {sum(e < 0 for e in result.count_errors)}"


def bench_diarization(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    streams = speaker_streams()
    print(
        "\ndiarization voices (s of trimmed speech): "
        + ", ".join(f"{s} {a.size / 16000:.1f}" for s, a in sorted(streams.items()))
    )
    recordings = [make_recording(rng, streams, 2 + n % 2) for n in range(args.recordings)]
    audio_s = sum(r.audio.size for r in recordings) / 16000
    turns = [e - s for r in recordings for s, e, _ in r.truth]
    print(
        f"{len(recordings)} recordings (seed {args.seed}; {sum(len(r.speakers) == 2 for r in recordings)} of 2 "
        f"speakers, {sum(len(r.speakers) == 3 for r in recordings)} of 3), {audio_s:.0f} s in all, {len(turns)} "
        f"turns of {min(turns):.1f}-{max(turns):.1f} s (mean {np.mean(turns):.1f} s); DER on a "
        f"{GRID_S * 1000:.0f} ms grid, {COLLAR_S} s collar around each reference boundary, best one-to-one mapping"
    )
    results = asyncio.run(diarize_all(recordings, args.diarize_thresholds))
    default = Settings(_env_file=None).diarize_cluster_threshold
    rows: list[tuple[str, Callable[[DiarizeResult], str]]] = [
        ("DER", lambda r: f"{r.total.der:.1%}"),
        ("  missed speech", lambda r: f"{r.total.missed / r.total.speech:.1%}"),
        ("  false alarm", lambda r: f"{r.total.false_alarm / r.total.speech:.1%}"),
        ("  speaker confusion", lambda r: f"{r.total.confusion / r.total.speech:.1%}"),
        ("DER, 2 speakers", lambda r: f"{r.by_speakers[2].der:.1%}"),
        ("DER, 3 speakers", lambda r: f"{r.by_speakers[3].der:.1%}"),
        ("speaker count right", lambda r: f"{np.mean(np.array(r.count_errors) == 0):.0%}"),
        ("speaker count MAE", lambda r: f"{np.mean(np.abs(r.count_errors)):.2f}"),
        (
            "  too many / too few",
            lambda r: f"{sum(e > 0 for e in r.count_errors)} / {sum(e < 0 for e in r.count_errors)}",
        ),
        ("diarizing, s per s of audio", lambda r: f"{r.seconds / r.audio_s:.3f}"),
    ]
    header = [f"{r.threshold:.2f}" + (" (default)" if r.threshold == default else "") for r in results]
    print(f"\n{'diarize_cluster_threshold':<28}" + "".join(f"{h:>16}" for h in header))
    for label, cell in rows:
        print(f"{label:<28}" + "".join(f"{cell(r):>16}" for r in results))
    if args.diarize_plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        x = np.arange(len(results))
        bottom = np.zeros(len(results))
        for part, colour in (("missed", "tab:blue"), ("false_alarm", "tab:orange"), ("confusion", "tab:red")):
            values = np.array([getattr(r.total, part) / r.total.speech * 100 for r in results])
            ax.bar(x, values, 0.5, bottom=bottom, label=part.replace("_", " "), color=colour)
            bottom += values
        for i, r in enumerate(results):
            ax.text(
                i,
                bottom[i] + 0.3,
                f"DER {r.total.der:.1%}\n2 spk {r.by_speakers[2].der:.1%}, "
                f"3 spk {r.by_speakers[3].der:.1%}\ncount right {np.mean(np.array(r.count_errors) == 0):.0%}",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_xticks(x, header)
        ax.set_xlabel("diarize_cluster_threshold")
        ax.set_ylabel("% of reference speech")
        ax.set_ylim(0, max(bottom) * 1.5 + 1)
        ax.set_title(f"diarization: {len(recordings)} recordings of 2-3 of {len(streams)} voices, {COLLAR_S} s collar")
        ax.legend(loc="upper left")
        fig.tight_layout()
        args.diarize_plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.diarize_plot, dpi=90)
        print(f"plot: {args.diarize_plot}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threshold", type=float, default=Settings(_env_file=None).speaker_threshold)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--part", choices=["both", "verify", "diarize"], default="both")
    parser.add_argument("--recordings", type=int, default=30, help="diarization: recordings to build")
    parser.add_argument("--seed", type=int, default=36, help="diarization: the recordings' random seed")
    parser.add_argument(
        "--diarize-thresholds",
        type=lambda text: [float(t) for t in text.split(",")],
        default=[0.55, 0.65, 0.75],
        help="diarization: diarize_cluster_threshold values, side by side",
    )
    parser.add_argument("--diarize-plot", type=Path, default=None, help="diarization: DER per threshold (PNG)")
    args = parser.parse_args()
    if args.part != "diarize":
        verify(args)
    if args.part != "verify":
        bench_diarization(args)


def verify(args: argparse.Namespace) -> None:

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    # The server's model: GE2E, or the ONNX file MEDIASERVER_SPEAKER_MODEL_PATH names.
    encoder = _load_encoder(model_path(Settings(_env_file=None)))
    load_s = time.perf_counter() - started
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    all_voices = voices()
    embedded: dict[str, tuple[np.ndarray, float]] = {}
    for voice in all_voices:
        embedded[voice.name] = (encoder.embed(voice.audio), voiced_seconds(voice.audio))
    speakers = {v.speaker for v in all_voices}
    print(f"{len(all_voices)} voices, {len(speakers)} speakers ({', '.join(sorted(speakers))})")

    results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for clips_per_enrolment in (1, 3):
        genuine: list[float] = []
        impostor: list[float] = []
        for speaker in sorted({"reader", "forever", "jfk"}):
            own = [v for v in all_voices if v.speaker == speaker]
            others = [v for v in all_voices if v.speaker != speaker]
            if len(own) <= clips_per_enrolment:
                continue  # nothing left to test on
            for chosen in itertools.combinations(own, clips_per_enrolment):
                model = enrolment([embedded[v.name][0] for v in chosen], [embedded[v.name][1] for v in chosen])
                genuine += [float(embedded[v.name][0] @ model) for v in own if v not in chosen]
                impostor += [float(embedded[v.name][0] @ model) for v in others]
        g, i = np.array(genuine), np.array(impostor)
        results[clips_per_enrolment] = (g, i)
        rate, at = eer(g, i)
        print(f"\nenrolled from {clips_per_enrolment} clip(s): {g.size} genuine trials, {i.size} impostor trials")
        print(
            f"  EER {rate:.1%} (at {at:.3f}); genuine min {g.min():.3f} mean {g.mean():.3f}; "
            f"impostor max {i.max():.3f} mean {i.mean():.3f}"
        )
        for threshold in sorted({args.threshold, 0.65, 0.7, 0.8, 0.85}):
            far, frr = rates(g, i, threshold)
            marker = "  <- speaker_threshold" if threshold == args.threshold else ""
            print(f"  threshold {threshold:.2f}: false accepts {far:6.1%}, false rejects {frr:6.1%}{marker}")

    # Cost: one 3 s voice alone, and eight at once (one batch), on this machine.
    three_s = next(v.audio for v in all_voices if v.name == "librivox_0880")
    alone = []
    for _ in range(5):
        started = time.perf_counter()
        encoder.embed(three_s)
        alone.append(time.perf_counter() - started)
    batched = []
    for _ in range(3):
        started = time.perf_counter()
        encoder.embed_batch([three_s] * 8)
        batched.append((time.perf_counter() - started) / 8)
    print(
        f"\ncost of a 3 s voice: {np.median(alone) * 1000:.0f} ms alone, {np.median(batched) * 1000:.0f} ms each in a "
        f"batch of 8 ({np.median(alone) / np.median(batched):.1f}x less); encoder load {load_s:.2f} s, "
        f"+{(rss_after - rss_before) / 1024:.0f} MiB RSS"
    )
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, (clips, (g, i)) in zip(axes, results.items(), strict=True):
            bins = np.linspace(0.2, 1.0, 41)
            ax.hist(i, bins=bins, alpha=0.6, label=f"impostors ({i.size})", density=True)
            ax.hist(g, bins=bins, alpha=0.6, label=f"same speaker ({g.size})", density=True)
            ax.axvline(args.threshold, color="k", linestyle="--", label=f"speaker_threshold {args.threshold:g}")
            ax.set_title(f"enrolled from {clips} clip(s): EER {eer(g, i)[0]:.1%}")
            ax.set_xlabel("cosine similarity to the enrolment")
            ax.legend()
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=90)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()

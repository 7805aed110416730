#!/usr/bin/env python3
"""When the server's echo canceller lets speech starts through: simulated devices, answer by answer,
without and with the speech gate (``echo_speech_gate_db``).

The simulated device of ``tests/integration/test_echo_loop.py`` (and ``test_echo_realtime.py``): the
answers play back to back with a pause between them through a clipping loudspeaker (tanh) and a
synthetic room (RT60 0.2 s, seeded as the tests seed it) into the microphone, 150 ms late at gain
0.7, with a -60 dBFS noise floor; ``--rooms`` more devices vary the delay (60-300 ms), the gain
(0.4-1.2) and the room's seed. A fresh ``mediaserver.audio.echo.EchoCanceller`` per device cleans
the microphone in 20 ms pieces and the server's own segmenter (``VadSegmenter``: webrtcvad mode 3,
30 ms frames, 3 voiced of 5 start an utterance) takes them as a stream would, without a gate, with
``SpeechGate`` over the whole echo, and with the server's default gate (held over a fresh
canceller's first ``--hold-s``, then only while it converges, ``--converge-s``, and for
``--onset-ms`` from each onset of the answer audio, sound after ``--onset-gap-ms`` without any;
``--sentences``: answers of 2-3 sentences; ``--margin-db``, ``--tail-ms``, ``--removed-db``: all the
settings' defaults). Each speech
start during an answer's echo is one the echo would cut with barge-in on (no person speaks here).

Printed: each speech start of the tests' device, the answer it falls in and how far into that
answer's echo; then the count per answer and device, per gate. It measures how
long AEC3 leaks on a fresh stream (issue #37's "first second") and what the gate keeps out.

    python tools/echo_leaks.py [--answers 4] [--rooms 8] [--sentences] [--onset-ms 500] [--plot PNG]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mediaserver.audio.echo import EchoCanceller

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.echo_room import VAD_FRAME, echoing_device  # noqa: E402

RATE = 16000
TEXTS = [
    "Cows eat grass, hay and grain, and they spend many hours each day chewing their food slowly.",
    "Bees make honey from the nectar of flowers, and they also make wax to build their hives.",
    "Cows are large farm animals that give us milk, and they live in herds on green pastures.",
    "The weather today is sunny with a light breeze, perfect for a walk in the park.",
]
# ``--sentences``: answers of two or three sentences, as the voice loop speaks them (each sentence
# synthesized on its own and sent after the one before): the live leaks came at a sentence's first
# syllable ("... nutritional needs. They", "Bees are").
SENTENCES = [
    ["Cows are herbivores, which means they eat plants.", "They primarily consume grass, hay and grain.",
     "They spend many hours each day chewing."],
    ["Bees make honey from the nectar of flowers.", "Bees are also important pollinators.",
     "They live in large colonies called hives."],
    ["The sky looks blue because of the way sunlight scatters.", "At sunset it can turn orange and red."],
    ["A good breakfast has protein and fiber.", "Eggs, oatmeal and fruit are all great choices.",
     "Try to drink a glass of water too."],
]  # fmt: skip
# (delay ms, gain, room seed): the tests' device first, then others.
DEVICES = [
    (150, 0.7, 7),
    (150, 0.7, 8),
    (250, 1.0, 9),
    (60, 0.5, 10),
    (300, 0.9, 11),
    (100, 0.7, 12),
    (200, 1.2, 13),
    (150, 0.4, 14),
]
PIECE = 320  # 20 ms, as a stream feeds the canceller


def level_db(x: np.ndarray, frames: int) -> np.ndarray:
    power = np.mean(np.square(x[: frames * VAD_FRAME].reshape(frames, VAD_FRAME), dtype=np.float64), axis=1)
    db: np.ndarray = 10 * np.log10(power + 1e-12)
    return db


def speech_starts(
    reference: np.ndarray,
    mic: np.ndarray,
    margin_db: float,
    tail_ms: float,
    removed_db: float,
    ends: list[float] | None = None,
    canceller: EchoCanceller | None = None,
    converge_s: float = 0.0,
    onset_ms: float = 0.0,
    hold_s: float = 0.0,
    onset_gap_ms: float = 100.0,
    track: bool = False,
    residual: float = 0.0,
    suspects: list[float] | None = None,
) -> tuple[list[float], np.ndarray]:
    """(speech starts in s, the canceller's output): a stream's canceller and segmenter, gated or not
    (``ends``: a list given gets where each utterance ended, in s of the stream; ``canceller``: a
    fresh one to use instead of the server's, tools/aec3_config.py; ``track``: the server's with its
    delay tracker on, a 1 s window, as the server runs it by default; ``suspects``: a list given gets
    the starts that were suspect, ``SpeechStart.suspect``, which pause an answer instead of cutting it)."""
    from mediaserver.audio.echo import EchoCanceller, SpeechGate
    from mediaserver.audio.echo_delay import RESIDUAL_WINDOW_S, TRACK_WINDOW_S, DelayTracker, ResidualEcho
    from mediaserver.audio.segmenter import Discarded, SpeechStart, Utterance, VadSegmenter
    from mediaserver.config import Settings

    if canceller is None:
        settings = Settings()
        residual_echo = ResidualEcho(RESIDUAL_WINDOW_S, settings.echo_delay_track_max_ms)
        tracker = DelayTracker(TRACK_WINDOW_S, settings.echo_delay_track_max_ms) if track else None
        canceller = EchoCanceller(tracker=tracker, residual=residual_echo)
    canceller.played(reference, 0)
    segmenter = VadSegmenter()
    if margin_db > 0:
        segmenter.gate = SpeechGate(
            canceller,
            margin_db,
            tail_ms,
            removed_db,
            converge_s=converge_s,
            onset_ms=onset_ms,
            onset_gap_ms=onset_gap_ms,
            hold_s=hold_s,
            residual=residual,
        )
    starts, out = [], []
    for i in range(0, mic.size, PIECE):
        cleaned = canceller.process(mic[i : i + PIECE])
        out.append(cleaned)
        for event in segmenter.push(cleaned):
            if isinstance(event, SpeechStart):
                starts.append(segmenter.position_ms / 1000.0)  # when it triggered (its start has pre-roll)
                if event.suspect and suspects is not None:
                    suspects.append(starts[-1])
            elif isinstance(event, Utterance | Discarded) and ends is not None:
                ends.append(segmenter.position_ms / 1000.0)
    return starts, np.concatenate(out)


def per_answer(starts: list[float], echo_from: list[float]) -> list[int]:
    """Speech starts counted by the answer whose echo they fall in (before the first: the noise floor)."""
    counts = [0] * len(echo_from)
    for at_s in starts:
        index = max((k for k, t in enumerate(echo_from) if t <= at_s), default=-1)
        if index >= 0:
            counts[index] += 1
    return counts


Variant = tuple[str, float, float, float, float]  # (label, margin dB, converge s, onset ms, hold s)


def variants(margin_db: float, converge_s: float, onset_ms: float, hold_s: float) -> list[Variant]:
    """No gate; the gate over the whole echo; the server's default (a hold, then converging and onsets)."""
    return [
        ("no gate", 0.0, 0.0, 0.0, 0.0),
        ("whole echo", margin_db, 0.0, 0.0, 0.0),
        (
            f"hold {hold_s:g} s, converging {converge_s:g} s, onsets {onset_ms:g} ms",
            margin_db,
            converge_s,
            onset_ms,
            hold_s,
        ),
    ]


def barge_ins(
    gates: list[Variant],
    tail_ms: float,
    removed_db: float,
    onset_gap_ms: float,
    track: bool,
    residual: float,
) -> None:
    """The harder rooms of tools/bench_echo.py (17 sessions of 3 answers, RT60 0.3 s, 20-300 ms, the
    delay jumping in every other one; real human recordings barging in during the last answer of two
    sessions in three), per gate: speech starts in the echo before any person speaks, and how soon a
    person barging in starts an utterance (when the segmenter triggers)."""
    sys.path.insert(0, str(REPO / "tools"))
    import bench_echo

    from tests.echo_room import ACTIVE_RMS

    heard: dict[str, list[float]] = {label: [] for label, *_ in gates}
    joined = dict.fromkeys(heard, 0)
    leaks = {label: [0, 0] for label in heard}  # (constant delay, delay jumps)
    leaks_suspect = dict.fromkeys(heard, 0)  # of those, suspect starts (they pause the answer, words decide)
    person_suspect = dict.fromkeys(heard, 0)  # a person's first start that was suspect
    for trial, jump in bench_echo.sessions(51, 37):
        first_echo = int(np.argmax(np.abs(trial.reference) > 0.01)) / RATE
        person = trial.barge_at is not None
        onset = int(np.argmax(np.abs(trial.near) > ACTIVE_RMS)) / RATE if person else float("inf")
        for label, margin, converge_s, onset_ms, hold_s in gates:
            ends: list[float] = []
            suspects: list[float] = []
            starts, _ = speech_starts(
                trial.reference,
                trial.mic,
                margin,
                tail_ms,
                removed_db,
                ends,
                converge_s=converge_s,
                onset_ms=onset_ms,
                hold_s=hold_s,
                onset_gap_ms=onset_gap_ms,
                track=track,
                residual=residual,
                suspects=suspects,
            )
            leaks[label][jump] += sum(1 for t in starts if first_echo <= t < onset - 0.1)
            leaks_suspect[label] += sum(1 for t in suspects if first_echo <= t < onset - 0.1)
            if not person:
                continue
            before = [t for t in starts if t < onset - 0.1]
            if before and not [e for e in ends if before[-1] < e <= onset]:
                joined[label] += 1  # a leak's utterance was under way: barge-in had already cut the answer
                continue
            after = [t for t in starts if t >= onset - 0.1]
            heard[label].append(after[0] - onset if after else float("inf"))
            person_suspect[label] += bool(after) and after[0] in suspects
    for label in heard:
        print(
            f"harder rooms, {label}: {sum(leaks[label])} speech starts in the echo before anyone spoke "
            f"({leaks[label][0]} in the 9 sessions with a constant delay, {leaks[label][1]} in the 8 whose delay "
            f"jumps); {leaks_suspect[label]} of them suspect (pausing the answer, not cutting it)"
        )
    for label in heard:
        values = np.array(heard[label])
        found = values[np.isfinite(values)]
        print(
            f"person barging in, {label}: speech start {np.median(found):.2f} s median, "
            f"{np.quantile(found, 0.9):.2f} s p90, {found.max():.2f} s max after they begin; "
            f"not heard {int((~np.isfinite(values)).sum())}; {joined[label]} more joined an utterance a leak "
            f"had started (the answer already cut); {person_suspect[label]} started suspect "
            "(cut once their words are in)"
        )


def main(argv: list[str] | None = None) -> int:
    from mediaserver.config import Settings

    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answers", type=int, default=4)
    parser.add_argument("--rooms", type=int, default=len(DEVICES), help="simulated devices (the tests' first)")
    parser.add_argument("--pause-s", type=float, default=1.5)
    parser.add_argument(
        "--margin-db", type=float, default=defaults.echo_speech_gate_db or 20.0, help="the gate's echo_speech_gate_db"
    )
    parser.add_argument("--tail-ms", type=float, default=defaults.echo_speech_gate_tail_ms)
    parser.add_argument("--removed-db", type=float, default=defaults.echo_speech_gate_removed_db)
    parser.add_argument("--converge-s", type=float, default=defaults.echo_speech_gate_converge_s)
    parser.add_argument("--onset-ms", type=float, default=defaults.echo_speech_gate_onset_ms)
    parser.add_argument("--onset-gap-ms", type=float, default=defaults.echo_speech_gate_onset_gap_ms)
    parser.add_argument(
        "--sentences", action="store_true", help="answers of 2-3 sentences, each synthesized on its own (SENTENCES)"
    )
    parser.add_argument("--hold-s", type=float, default=defaults.echo_speech_gate_hold_s)
    parser.add_argument("--noise-dbfs", type=float, default=-60.0, help="the microphone's noise floor")
    parser.add_argument(
        "--track",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the canceller's delay tracker (echo_delay_track_s 1, the server's default; --no-track: off)",
    )
    parser.add_argument(
        "--residual",
        type=float,
        default=defaults.echo_speech_gate_residual,
        help="the gate's residual-echo rule (echo_speech_gate_residual; 0 = off)",
    )
    parser.add_argument("--plot", type=Path)
    parser.add_argument(
        "--barge-ins", action=argparse.BooleanOptionalAction, default=True, help="the person's side too (30 s)"
    )
    args = parser.parse_args(argv)

    from tests.conftest import synthesize

    if args.sentences:
        texts = [SENTENCES[i % len(SENTENCES)] for i in range(args.answers)]
        answers = [np.concatenate([synthesize(s).audio16k.astype(np.float32) for s in each]) for each in texts]
    else:
        answers = [synthesize(TEXTS[i % len(TEXTS)]).audio16k.astype(np.float32) for i in range(args.answers)]
    print(
        f"{args.answers} answers per device, pause {args.pause_s} s; gate {args.margin_db} dB over the floor, "
        f"{args.tail_ms:.0f} ms tail, under {args.removed_db} dB removed"
    )
    gates = variants(args.margin_db, args.converge_s, args.onset_ms, args.hold_s)
    print(f"{'device':>24s}  speech starts per answer: " + " / ".join(label for label, *_ in gates))
    totals = {label: np.zeros(args.answers, int) for label, *_ in gates}
    shown = None
    for n, (delay_ms, gain, seed) in enumerate(DEVICES[: args.rooms]):
        reference, mic, echo_at = echoing_device(
            answers, delay_ms, gain, seed, args.pause_s, noise_rms=10 ** (args.noise_dbfs / 20)
        )
        echo_from = [at / RATE for at in echo_at]
        found: dict[str, list[float]] = {}
        out = np.zeros(0, np.float32)
        for label, margin, converge_s, onset_ms, hold_s in gates:
            starts, cleaned = speech_starts(
                reference,
                mic,
                margin,
                args.tail_ms,
                args.removed_db,
                converge_s=converge_s,
                onset_ms=onset_ms,
                hold_s=hold_s,
                onset_gap_ms=args.onset_gap_ms,
                track=args.track,
                residual=args.residual,
            )
            found[label] = starts
            out = cleaned if margin == 0 else out
            totals[label] += per_answer(starts, echo_from)
        name = f"{delay_ms} ms, gain {gain}, room {seed}"
        print(f"{name:>24s}  " + " / ".join(str(per_answer(found[label], echo_from)) for label, *_ in gates))
        if n == 0:
            shown = (mic, out, echo_from, found[gates[0][0]], found[gates[-1][0]])
    print(f"{'all':>24s}  " + " / ".join(str(totals[label].tolist()) for label, *_ in gates))
    print("speech starts in the echo: " + ", ".join(f"{label} {totals[label].sum()}" for label, *_ in gates))
    if args.barge_ins:
        barge_ins(gates, args.tail_ms, args.removed_db, args.onset_gap_ms, args.track, args.residual)
    if args.plot and shown is not None:
        plot(args.plot, answers, *shown)
        print(f"plot: {args.plot}")
    return 0


def plot(path: Path, answers: list[np.ndarray], mic, out, echo_from, off, gated) -> None:  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = out.size // VAD_FRAME
    frame_s = VAD_FRAME / RATE
    out = np.concatenate([out[128:], np.zeros(128, np.float32)])  # AEC3's own 8 ms
    t = np.arange(frames) * frame_s
    fig, ax = plt.subplots(figsize=(11, 3.6))
    ax.plot(t, level_db(mic, frames), color="#bbbbbb", lw=0.8, label="microphone (echo)")
    ax.plot(t, level_db(out, frames), color="#1f77b4", lw=0.8, label="canceller output")
    for at_s in off:
        ax.axvline(at_s, color="#d62728", lw=1.0)
    for at_s in gated:
        ax.axvline(at_s, color="#000000", lw=1.5, ls="--")
    for k, t0 in enumerate(echo_from):
        ax.axvspan(t0, t0 + answers[k].size / RATE, color="#2ca02c", alpha=0.08)
    ax.set_ylim(-80, 0)
    ax.set_xlabel(
        "s (green: an answer's echo; red: a speech start without the gate; black dashed: with the default gate)"
    )
    ax.set_ylabel("dBFS per 30 ms")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Where AEC3 lets a speech start through on a fresh stream, the tests' device (tools/echo_leaks.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())

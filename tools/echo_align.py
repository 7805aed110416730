#!/usr/bin/env python3
"""Answers that land a frame apart: the echo leaks at an answer's first syllable, and the two
defences (``echo_align_wait_ms``, ``echo_speech_gate_restart_ms``; issue #37).

A device plays an answer's first audio from its next frame after the audio arrives. The server
placed it on its clock at the microphone audio arrived so far; sent at a random moment, the device
played it there or one frame (20 ms) later, so from one answer to the next the echo's delay moved
by a frame at random, and AEC3 let the first syllable through while it found the new delay. Live,
every run of the defaults echo test that placed two answers differently had an answer cut by a
leak, and none of those that placed them alike (docs/echo.md, "Answers a frame apart").

Here, on echo_leaks.py's eight simulated devices (the live tests' device first), each answer of
two or three Piper sentences plays 0 or ``--frame-ms`` late at random (``--late``: random), or
always on time (``aligned``: what ``echo_align_wait_ms`` achieves); a fresh canceller per device
and the server's segmenter with the default speech gate take the microphone as a stream would, the
canceller told where each answer starts afresh (``EchoCanceller.restarted``). Printed per case:
speech starts in the echo (each would cut an answer: nobody speaks here), and how many of them
are suspect starts (``SpeechStart.suspect``: the answer pauses and its words decide) with
``echo_speech_gate_restart_ms`` at the default and at 0.

    python tools/echo_align.py [--answers 4] [--seeds 3] [--plot docs/echo-align.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from echo_leaks import DEVICES, PIECE, SENTENCES  # noqa: E402

from tests.echo_room import echoing_device  # noqa: E402

RATE = 16000


def starts_in_echo(
    reference: np.ndarray, mic: np.ndarray, answer_starts: list[int], restart_ms: int
) -> list[tuple[float, bool]]:
    """(when, suspect) of each speech start the server's default gate lets through."""
    from mediaserver.audio.echo import EchoCanceller, SpeechGate
    from mediaserver.audio.segmenter import SpeechStart, VadSegmenter
    from mediaserver.config import Settings

    canceller = EchoCanceller()
    canceller.played(reference, 0)
    for at in answer_starts:
        canceller.restarted(at)
    segmenter = VadSegmenter()
    segmenter.gate = SpeechGate.of(canceller, Settings(echo_speech_gate_restart_ms=restart_ms))
    found = []
    for i in range(0, mic.size, PIECE):
        for event in segmenter.push(canceller.process(mic[i : i + PIECE])):
            if isinstance(event, SpeechStart):
                found.append((segmenter.position_ms / 1000.0, event.suspect))
    return found


def main(argv: list[str] | None = None) -> int:
    from mediaserver.config import Settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answers", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3, help="random placements per device")
    parser.add_argument("--frame-ms", type=float, default=20.0, help="how late a late answer plays")
    parser.add_argument("--pause-s", type=float, default=1.5)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    from tests.conftest import synthesize

    texts = [SENTENCES[i % len(SENTENCES)] for i in range(args.answers)]
    answers = [np.concatenate([synthesize(s).audio16k.astype(np.float32) for s in each]) for each in texts]
    frame = int(args.frame_ms * RATE / 1000)
    restart_default = Settings().echo_speech_gate_restart_ms
    # per (device, seed): (starts, suspect at the default restart_ms, suspect at 0)
    cases: dict[str, list[tuple[int, int, int]]] = {"aligned": [], "late": []}
    print(f"{len(DEVICES)} devices x {args.seeds} placements x {args.answers} answers of 2-3 sentences")
    print(f"{'device':>22s} {'placement':>10s}  starts in the echo (suspect with restart_ms {restart_default} / 0)")
    for delay_ms, gain, seed in DEVICES:
        for n in range(args.seeds):
            rng = np.random.default_rng(1000 * seed + n)
            late = [int(rng.integers(0, 2)) * frame for _ in answers]
            late[0] = 0  # the first answer sets the delay the others are judged against
            for case, shifts in (("aligned", []), ("late", late)):
                reference, mic, echo_at = echoing_device(answers, delay_ms, gain, seed, args.pause_s, late=shifts)
                starts = [at - int(delay_ms * RATE / 1000) for at in echo_at]
                with_restarts = starts_in_echo(reference, mic, starts, restart_default)
                without = starts_in_echo(reference, mic, starts, 0)
                row = (len(with_restarts), sum(s for _, s in with_restarts), sum(s for _, s in without))
                cases[case].append(row)
                moved = "".join("+" if s else "0" for s in shifts) or "0" * len(answers)
                print(f"{f'{delay_ms} ms, {gain}, room {seed}':>22s} {moved:>10s}  {row[0]} ({row[1]} / {row[2]})")
    print()
    print(f"| placement | speech starts in the echo | suspect, restart_ms {restart_default} | suspect, 0 | cut |")
    print("|---|---|---|---|---|")
    for case, rows in cases.items():
        total = np.sum(rows, axis=0) if rows else np.zeros(3, int)
        print(f"| {case} | {total[0]} | {total[1]} | {total[2]} | {total[0] - total[1]} |")
    if args.plot:
        plot(args.plot, cases, restart_default)
        print(f"plot: {args.plot}")
    return 0


def plot(path: Path, cases: dict[str, list[tuple[int, int, int]]], restart_ms: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = list(cases)
    totals = [np.sum(cases[c], axis=0) for c in labels]
    x = np.arange(len(labels))
    cut_without = [t[0] - t[2] for t in totals]
    cut_with = [t[0] - t[1] for t in totals]
    ax.bar(x - 0.2, cut_without, 0.4, label="would cut: restart_ms 0")
    ax.bar(x + 0.2, cut_with, 0.4, label=f"would cut: restart_ms {restart_ms} (default)")
    ax.set_xticks(x, ["answers on time (aligned)", "answers 0 or 1 frame late"])
    ax.set_ylabel("speech starts in the echo that cut (not suspect)")
    ax.set_title("8 simulated devices x 3 placements x 4 answers, nobody speaking")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())

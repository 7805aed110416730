#!/usr/bin/env python3
"""When the server's echo canceller lets speech starts through: the echo tests' device, answer by answer.

The simulated device of ``tests/integration/test_echo_loop.py`` (and ``test_echo_realtime.py``): the
answers play back to back with a pause between them through a clipping loudspeaker (tanh) and a
synthetic room (RT60 0.2 s, seeded as the tests seed it) into the microphone, ``--delay-ms`` late at
``--gain``, with a -60 dBFS noise floor. ``mediaserver.audio.echo.EchoCanceller`` cleans it in 20 ms
pieces, as a stream would feed it; webrtcvad (mode 3, 30 ms frames) and the segmenter's trigger (3
voiced frames of 5) then say where a speech start would be taken on the canceller's output: each
one is an answer the echo would cut with barge-in on (no person speaks here).

Printed: each speech start, the answer it falls in and how far into that answer's echo, and the
canceller's output against the microphone's level over its trigger window; then the count per
answer. It measures how long AEC3 takes to stop leaking on a fresh stream (issue #37's "first
second"), not a target.

    python tools/echo_leaks.py [--answers 4] [--delay-ms 150] [--gain 0.7] [--pause-s 1.5] [--plot PNG]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.echo_room import VAD_FRAME, room_ir, voiced  # noqa: E402

RATE = 16000
TEXTS = [
    "Cows eat grass, hay and grain, and they spend many hours each day chewing their food slowly.",
    "Bees make honey from the nectar of flowers, and they also make wax to build their hives.",
    "Cows are large farm animals that give us milk, and they live in herds on green pastures.",
    "The weather today is sunny with a light breeze, perfect for a walk in the park.",
]
TRIGGER_WINDOW, TRIGGER_VOICED = 5, 3  # the segmenter's defaults (audio/segmenter.py)


def level_db(x: np.ndarray, frames: int) -> np.ndarray:
    power = np.mean(np.square(x[: frames * VAD_FRAME].reshape(frames, VAD_FRAME), dtype=np.float64), axis=1)
    db: np.ndarray = 10 * np.log10(power + 1e-12)
    return db


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answers", type=int, default=4)
    parser.add_argument("--delay-ms", type=float, default=150.0)
    parser.add_argument("--gain", type=float, default=0.7)
    parser.add_argument("--pause-s", type=float, default=1.5)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)

    from mediaserver.audio.echo import EchoCanceller
    from tests.conftest import synthesize

    answers = [synthesize(TEXTS[i % len(TEXTS)]).audio16k.astype(np.float32) for i in range(args.answers)]
    pause = np.zeros(int(args.pause_s * RATE), np.float32)
    parts: list[np.ndarray] = [np.zeros(RATE, np.float32)]
    starts = []
    for answer in answers:
        starts.append(sum(p.size for p in parts))
        parts += [answer, pause]
    reference = np.concatenate(parts)
    delay = int(args.delay_ms * RATE / 1000)
    ir = room_ir(np.random.default_rng(7), rt60_s=0.2)
    wet = np.convolve(np.concatenate([np.zeros(delay, np.float32), reference]), ir)[: reference.size] * args.gain
    noise = np.random.default_rng(1).standard_normal(reference.size) * 1e-3
    mic = (np.tanh(wet * 1.5) / 1.5 + noise).astype(np.float32)

    canceller = EchoCanceller()
    canceller.played(reference, 0)
    out = np.concatenate([canceller.process(mic[i : i + 320]) for i in range(0, mic.size, 320)])
    out = np.concatenate([out[128:], np.zeros(128, np.float32)])  # AEC3's own 8 ms
    frames = out.size // VAD_FRAME
    speech = voiced(out[: frames * VAD_FRAME])
    out_db, mic_db = level_db(out, frames), level_db(mic, frames)

    echo_from = [(s + delay) / RATE for s in starts]
    frame_s = VAD_FRAME / RATE
    triggers, last = [], -10
    for i in range(TRIGGER_WINDOW, frames):
        if speech[i - TRIGGER_WINDOW : i].sum() >= TRIGGER_VOICED and i - last > TRIGGER_WINDOW:
            at_s = i * frame_s
            index = max((k for k, t in enumerate(echo_from) if t <= at_s), default=-1)
            if index >= 0:  # (before the first echo there is only the noise floor)
                triggers.append((at_s, index, i))
            last = i
        elif speech[i - TRIGGER_WINDOW : i].sum() >= TRIGGER_VOICED:
            last = i
    print(f"{args.answers} answers, delay {args.delay_ms:.0f} ms, gain {args.gain}, pause {args.pause_s} s")
    print("speech start  answer  into its echo  output dBFS (max of window)  microphone dBFS")
    for at_s, index, i in triggers:
        window = slice(i - TRIGGER_WINDOW, i)
        print(
            f"{at_s:11.2f} s  {index + 1:6d}  {at_s - echo_from[index]:11.2f} s  "
            f"{out_db[window].max():25.0f}  {mic_db[window].max():15.0f}"
        )
    counts = [sum(1 for _, k, _ in triggers if k == n) for n in range(args.answers)]
    print("speech starts per answer:", ", ".join(f"#{n + 1}: {c}" for n, c in enumerate(counts)))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t = np.arange(frames) * frame_s
        fig, ax = plt.subplots(figsize=(11, 3.6))
        ax.plot(t, mic_db, color="#bbbbbb", lw=0.8, label="microphone (echo)")
        ax.plot(t, out_db, color="#1f77b4", lw=0.8, label="canceller output")
        for at_s, _, _ in triggers:
            ax.axvline(at_s, color="#d62728", lw=1.0)
        for k, t0 in enumerate(echo_from):
            ax.axvspan(t0, t0 + answers[k].size / RATE, color="#2ca02c", alpha=0.08)
        ax.set_ylim(-80, 0)
        ax.set_xlabel("s (green: an answer's echo; red: a speech start on the output)")
        ax.set_ylabel("dBFS per 30 ms")
        ax.legend(loc="lower right", fontsize=8)
        ax.set_title("Where AEC3 lets a speech start through on a fresh stream (tools/echo_leaks.py)")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""``echo_cancellation: auto`` against ``on`` and ``off``, on devices that cancel their own echo and
on devices that do not (issue #37; docs/echo.md, auto).

A device that cancels its own echo (no echo reaches the server, or a residual at ``--residual-db``)
plays Piper answers while a real person (the suite's recordings, tests/human_speech.py) barges in,
during the first answer of a fresh stream or the third; the answer plays on. Each stream goes
through the server's ``EchoCanceller`` (``on``: its output; ``auto``: its output only where
``EchoPresence`` hears the echo; ``off``: none) and segmenter (``VadSegmenter`` with the default
speech gate, the settings' defaults), fed 20 ms pieces. Per mode: when the segmenter first triggers
after the person begins (median / p90 / max), how many are never heard, and how much of them the
output keeps (the correlation with the clean person over their speech, above 150 Hz). Then the
echoing devices (tools/echo_leaks.py's eight, tools/bench_echo.py's 17 rooms): when auto decides
they echo, and whether it ever lets their echo pass.

    python tools/echo_auto.py [--trials 24] [--plot docs/echo-auto.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from tests import echo_room as room  # noqa: E402
from tests.echo_room import ACTIVE_RMS, VAD_FRAME  # noqa: E402

RATE = 16000
PIECE = 320
MODES = ("off", "on", "auto")


def stream(mic: np.ndarray, reference: np.ndarray, mode: str) -> tuple[list[float], np.ndarray, object]:
    """(speech starts in s, output, the canceller or None) for one stream in ``mode``."""
    from mediaserver.audio.echo import SpeechGate
    from mediaserver.audio.echo_line import EchoLine
    from mediaserver.audio.segmenter import SpeechStart, VadSegmenter
    from mediaserver.config import Settings

    settings = Settings(_env_file=None)
    segmenter = VadSegmenter()
    canceller = None
    if mode != "off":
        line = EchoLine.of(settings)  # as a stream's, the delay tracker included
        line.set_mode("auto" if mode == "auto" else "on", settings)
        canceller = line.canceller
        canceller.played(reference, 0)
        segmenter.gate = SpeechGate.of(canceller, settings)
    starts, out = [], []
    for i in range(0, mic.size, PIECE):
        piece = mic[i : i + PIECE]
        cleaned = canceller.process(piece) if canceller is not None else piece
        out.append(cleaned)
        for event in segmenter.push(cleaned):
            if isinstance(event, SpeechStart):
                starts.append(segmenter.position_ms / 1000.0)
    return starts, np.concatenate(out), canceller


def self_cancelling(
    answers: list[np.ndarray], people: list[np.ndarray], residual_db: float, which: str, trials: int
) -> dict[str, dict[str, list[float]]]:
    """Per mode: heard (s after the person began; inf: never) and kept (correlation), per trial."""
    from mediaserver.audio.echo import OUTPUT_LATENCY_SAMPLES

    rng = np.random.default_rng(5)
    found: dict[str, dict[str, list[float]]] = {mode: {"heard": [], "kept": []} for mode in MODES}
    for k in range(trials):
        person = people[k % len(people)]
        near = (person / room.rms(person) * rng.uniform(0.04, 0.1)).astype(np.float32)
        played = answers[:1] if which == "first" else answers
        trial = room.simulate(played, rng, near=near, delays_ms=[rng.uniform(20, 300)], cut_after_s=None)
        noise = trial.mic - trial.echo - trial.near
        residual = 0.0 if residual_db >= 100 else 10 ** (-residual_db / 20)
        mic = (trial.echo * residual + trial.near + noise).astype(np.float32)
        onset = int(np.argmax(np.abs(trial.near) > ACTIVE_RMS)) / RATE
        n = trial.near.size // VAD_FRAME
        speaking = np.abs(trial.near[: n * VAD_FRAME].reshape(n, VAD_FRAME)).max(axis=1) > ACTIVE_RMS
        for mode in MODES:
            starts, out, _ = stream(mic, trial.reference, mode)
            after = [t for t in starts if t >= onset - 0.1]
            found[mode]["heard"].append(after[0] - onset if after else float("inf"))
            lag = OUTPUT_LATENCY_SAMPLES if mode != "off" else 0
            aligned = np.concatenate([out[lag:], np.zeros(lag, np.float32)])
            m = min(n, aligned.size // VAD_FRAME)
            found[mode]["kept"].append(room.correlation(aligned[: m * VAD_FRAME], trial.near, speaking[:m]))
    return found


def echoing(answers: list[np.ndarray]) -> tuple[list[float], int]:
    """When auto found each echoing device's echo (s after the answer's first sound; inf: never), and
    how many of them it ever passed uncancelled."""
    import bench_echo
    from echo_leaks import DEVICES

    from tests.echo_room import echoing_device

    cases = [echoing_device(answers, d, g, seed, 1.5)[:2] for d, g, seed in DEVICES]
    cases += [(trial.reference, trial.mic) for trial, _ in bench_echo.sessions(51, 37)]
    decided, passed = [], 0
    for reference, mic in cases:
        from mediaserver.audio.echo_line import EchoLine
        from mediaserver.config import Settings

        settings = Settings(_env_file=None)
        line = EchoLine.of(settings)
        line.set_mode("auto", settings)
        canceller = line.canceller
        canceller.played(reference, 0)
        first = int(np.argmax(np.abs(reference) > 1e-3)) / RATE
        at, ever_passed = float("inf"), False
        for i in range(0, mic.size, PIECE):
            canceller.process(mic[i : i + PIECE])
            ever_passed |= canceller.passing
            if canceller.detect is not None and canceller.detect.echo and at == float("inf"):
                at = (i + PIECE) / RATE - first
        decided.append(at)
        passed += ever_passed
    return decided, passed


def residual_starts(answers: list[np.ndarray], residual_db: float, sessions: int) -> dict[str, int]:
    """Per mode: speech starts in the echo (nobody speaking) on a device whose own canceller leaves
    the echo ``residual_db`` under a plain device's: each would cut an answer with barge-in on."""
    rng = np.random.default_rng(9)
    counts = dict.fromkeys(MODES, 0)
    for _ in range(sessions):
        trial = room.simulate(answers, rng, delays_ms=[rng.uniform(20, 300)])
        noise = trial.mic - trial.echo
        mic = (trial.echo * 10 ** (-residual_db / 20) + noise).astype(np.float32)
        first = int(np.argmax(np.abs(trial.reference) > 0.01)) / RATE
        for mode in MODES:
            starts, _, _ = stream(mic, trial.reference, mode)
            counts[mode] += sum(1 for t in starts if t >= first)
    return counts


def summary(values: list[float]) -> str:
    v = np.array(values)
    f = v[np.isfinite(v)]
    return f"{np.median(f):.2f} / {np.quantile(f, 0.9):.2f} / {f.max():.2f} s, missed {int((~np.isfinite(v)).sum())}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=24, help="per case")
    parser.add_argument("--residual-db", type=float, default=30.0, help="the residual echo case (100: none)")
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)

    from echo_leaks import TEXTS

    from tests.conftest import synthesize
    from tests.human_speech import default_dir, load_clips

    answers = [synthesize(text).audio16k.astype(np.float32) for text in TEXTS[:3]]
    people = [clip for _, clip, _ in load_clips(default_dir())]
    cases = [("no echo, first answer", 100.0, "first"), ("no echo, third answer", 100.0, "later")]
    cases.append((f"residual -{args.residual_db:g} dB, first answer", args.residual_db, "first"))
    print(f"A device that cancels its own echo, a person barging in ({args.trials} trials per case):")
    print("| case | mode | heard after they begin: median / p90 / max | kept: mean / min |")
    print("|---|---|---|---|")
    results = {}
    for label, residual, which in cases:
        found = self_cancelling(answers, people, residual, which, args.trials)
        results[label] = found
        for mode in MODES:
            kept = found[mode]["kept"]
            print(f"| {label} | {mode} | {summary(found[mode]['heard'])} | {np.mean(kept):.2f} / {np.min(kept):.2f} |")
    sessions = max(1, args.trials * 2 // 3)
    print(f"A device whose own canceller leaves a residual echo, nobody speaking ({sessions} sessions x 3 answers):")
    print("| residual | speech starts in the echo: " + " / ".join(MODES) + " |")
    print("|---|---|")
    for residual in (20.0, 30.0, 40.0):
        counts = residual_starts(answers, residual, sessions)
        print(f"| -{residual:g} dB | " + " / ".join(str(counts[mode]) for mode in MODES) + " |")
    decided, passed = echoing(answers)
    d = np.array(decided)
    print(
        f"Echoing devices ({d.size}): auto found the echo {np.median(d):.2f} s median, {d.max():.2f} s max after "
        f"the first answer began; passed any uncancelled: {passed}"
    )
    if args.plot:
        plot(args.plot, results)
        print(f"plot: {args.plot}")
    return 0


def plot(path: Path, results: dict[str, dict[str, dict[str, list[float]]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.25
    labels = list(results)
    x = np.arange(len(labels))
    for k, mode in enumerate(MODES):
        heard = [np.median([h for h in results[c][mode]["heard"] if np.isfinite(h)]) for c in labels]
        kept = [np.mean(results[c][mode]["kept"]) for c in labels]
        axes[0].bar(x + (k - 1) * width, heard, width, label=mode)
        axes[1].bar(x + (k - 1) * width, kept, width, label=mode)
    for ax, title in zip(axes, ("person heard after they begin, median (s)", "person kept (correlation)"), strict=True):
        ax.set_xticks(x, [label.replace(", ", "\n") for label in labels])
        ax.set_title(title)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.2)
        ax.legend(ncol=3, loc="upper center")
    fig.suptitle("echo_cancellation on a device that cancels its own echo (tools/echo_auto.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())

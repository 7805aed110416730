#!/usr/bin/env python3
"""Server-side echo cancellation: the candidates side by side on a simulated device (issue #37).

Far end: Piper answers (``tools/speech_corpus.py``'s sentences, grouped three to a session); near
end: the suite's real human recordings (``tests/human_speech.py``). ``tests/echo_room.py`` plays the
answers through a clipping loudspeaker and a synthetic room (RT60 0.3 s) into the microphone after
a 20-300 ms delay (every other session the delay jumps mid-session), with gain and a little noise;
in two sessions of three a person barges in during the last answer, which the server cuts 0.4 s
later. Each candidate processes every session in 10 ms frames, one instance per session:

  - ``off``: the microphone as is;
  - ``aec3-pywebrtc``: WebRTC AEC3 through ``pywebrtc-audio`` via ``mediaserver.audio.echo``'s
    ``EchoCanceller`` (fed 20 ms pieces, as a stream would) without the delay tracker
    (``echo_delay_track_s`` 0): AEC3's own delay estimation;
  - ``aec3-pywebrtc-tracked``: the same as the server runs it by default, with the delay tracker
    (audio/echo_delay.py, ``echo_delay_track_s`` 1) re-aligning the reference after a jump to a
    later delay;
  - ``aec3-livekit``: WebRTC's APM with AEC3 + high-pass filter through ``livekit.rtc``;
  - ``speexdsp``: Speex's MDF echo canceller (``speexdsp``, 8192-tap filter: 512 ms, enough to
    cover the delay and room, since Speex has no delay estimation).

Figures: ERLE (dB, echo energy in / out over echo-only 30 ms frames, all sessions pooled; also
split into sessions with a constant delay and the ones whose delay jumps), webrtcvad (mode 3, 30 ms
frames: the server's segmenter) voiced echo-only frames (%) and the longest voiced run of them
(ms), the near end kept during double talk (correlation of the output with the clean near end over
double-talk frames, each candidate's fixed output latency compensated) and after the answer was cut
(near-end-only frames), and CPU time per second of audio for one stream.

Usage:
    python tools/bench_echo.py [--answers 51] [--plot docs/bench-echo.png] [--candidates off,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from tests import echo_room as room  # noqa: E402
from tests.echo_room import RATE, Audio, Trial  # noqa: E402

FRAME = 160
Runner = Callable[[Audio, Audio], Audio]  # (mic, reference) → output


def run_off(mic: Audio, reference: Audio) -> Audio:
    return mic.copy()


def run_mediaserver(mic: Audio, reference: Audio, *, track: bool = False) -> Audio:
    """The server's canceller: AEC3, with the delay tracker (``track``: a 1 s window, the default) or not."""
    from mediaserver.audio.echo import EchoCanceller
    from mediaserver.audio.echo_delay import TRACK_MAX_DELAY_MS, TRACK_WINDOW_S, DelayTracker

    ec = EchoCanceller(tracker=DelayTracker(TRACK_WINDOW_S, TRACK_MAX_DELAY_MS) if track else None)
    ec.played(reference, 0)
    piece = 320
    return np.concatenate([ec.process(mic[i : i + piece]) for i in range(0, mic.size, piece)])


def _pcm(x: Audio) -> bytes:
    return bytes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())


def run_livekit(mic: Audio, reference: Audio) -> Audio:
    from livekit import rtc

    apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)
    out = []
    for i in range(0, mic.size - FRAME + 1, FRAME):
        apm.process_reverse_stream(rtc.AudioFrame(_pcm(reference[i : i + FRAME]), RATE, 1, FRAME))
        frame = rtc.AudioFrame(_pcm(mic[i : i + FRAME]), RATE, 1, FRAME)
        apm.set_stream_delay_ms(0)
        apm.process_stream(frame)
        out.append(np.frombuffer(bytes(frame.data), np.int16).astype(np.float32) / 32768)
    return np.concatenate(out)


def run_speex(mic: Audio, reference: Audio) -> Audio:
    import speexdsp

    ec = speexdsp.EchoCanceller.create(FRAME, 8192, RATE)
    out = []
    for i in range(0, mic.size - FRAME + 1, FRAME):
        got = ec.process(_pcm(mic[i : i + FRAME]), _pcm(reference[i : i + FRAME]))
        out.append(np.frombuffer(got, np.int16).astype(np.float32) / 32768)
    return np.concatenate(out)


CANDIDATES: dict[str, Runner] = {
    "off": run_off,
    "aec3-pywebrtc": run_mediaserver,
    "aec3-pywebrtc-tracked": lambda mic, reference: run_mediaserver(mic, reference, track=True),
    "aec3-livekit": run_livekit,
    "speexdsp": run_speex,
}


def latency(run: Runner, speech: Audio) -> int:
    """The candidate's fixed output delay in samples: speech alone through it, best-matching lag."""
    out = run(speech, np.zeros_like(speech))
    n = out.size
    lags = range(0, 400)
    return max(lags, key=lambda lag: float(np.dot(out[lag:n], speech[: n - lag])))


def sessions(answers: int, seed: int) -> list[tuple[Trial, bool]]:
    """(trial, delay jumps) per session of three answers."""
    from speech_corpus import SENTENCES

    from tests.conftest import synthesize
    from tests.human_speech import default_dir, load_clips

    texts = [SENTENCES[i % len(SENTENCES)] for i in range(answers)]
    audio = [synthesize(t).audio16k.astype(np.float32) for t in texts]
    people = [clip for _, clip, _ in load_clips(default_dir())]
    rng = np.random.default_rng(seed)
    out = []
    for k in range(0, len(audio), 3):
        jump = k // 3 % 2 == 1
        near = None
        if k // 3 % 3 != 0:
            person = people[k // 3 % len(people)]
            near = (person / room.rms(person) * rng.uniform(0.04, 0.1)).astype(np.float32)
        delays = None if jump else [rng.uniform(20, 300)]
        out.append((room.simulate(audio[k : k + 3], rng, near=near, delays_ms=delays), jump))
    return out


def measure(name: str, run: Runner, trials: list[tuple[Trial, bool]], lag: int) -> dict[str, Any]:
    mic_e: dict[str, list[Audio]] = {"all": [], "const": [], "jump": []}
    out_e: dict[str, list[Audio]] = {"all": [], "const": [], "jump": []}
    voiced, runs, dt_corr, cut_corr, cpu, seconds = [], [], [], [], 0.0, 0.0
    for trial, jump in trials:
        t0 = time.process_time()
        out = run(trial.mic, trial.reference)
        cpu += time.process_time() - t0
        seconds += trial.mic.size / RATE
        out = np.concatenate([out[lag:], np.zeros(lag, np.float32)])  # undo the fixed latency
        n = out.size // room.VAD_FRAME
        echo_only, double = (m[:n] for m in trial.frames())
        frames = (np.s_[: n * room.VAD_FRAME],)
        mic, clean = trial.mic[frames], trial.near[frames]
        for key in ("all", "jump" if jump else "const"):
            mic_e[key].append(room._frames(mic, echo_only))
            out_e[key].append(room._frames(out, echo_only))
        vad = room.voiced(out)[:n]
        voiced.append(vad[echo_only])
        runs.append(room.longest_run(vad & echo_only))
        if trial.barge_at is not None and double.any():
            dt_corr.append(room.correlation(out, clean, double))
        if trial.barge_at is not None:
            near_rms = np.sqrt(np.mean(np.square(clean[: n * room.VAD_FRAME].reshape(n, -1)), axis=1))
            near_only = (near_rms > room.ACTIVE_RMS) & ~double & ~echo_only
            near_only[: trial.barge_at // room.VAD_FRAME] = False
            cut_corr.append(room.correlation(out, clean, near_only))

    def erle(key: str) -> float:
        a = sum(float(np.sum(np.square(x, dtype=np.float64))) for x in mic_e[key])
        b = sum(float(np.sum(np.square(x, dtype=np.float64))) for x in out_e[key])
        return float(10 * np.log10(a / max(b, 1e-12))) if mic_e[key] else float("nan")

    all_voiced = np.concatenate(voiced)
    return {
        "name": name,
        "erle_db": erle("all"),
        "erle_const_db": erle("const"),
        "erle_jump_db": erle("jump"),
        "voiced_pct": 100.0 * float(all_voiced.mean()),
        "longest_run_ms": 30 * max(runs),
        "dt_corr": float(np.mean(dt_corr)) if dt_corr else float("nan"),
        "dt_corr_min": float(np.min(dt_corr)) if dt_corr else float("nan"),
        "cut_corr": float(np.mean(cut_corr)) if cut_corr else float("nan"),
        "cut_corr_min": float(np.min(cut_corr)) if cut_corr else float("nan"),
        "cpu_ms_per_s": 1000 * cpu / seconds,
        "latency_ms": 1000 * lag / RATE,
    }


def plot(rows: list[dict[str, Any]], path: Path, answers: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8))
    panels = [
        ("ERLE, echo-only (dB)", ["erle_const_db", "erle_jump_db"], ["constant delay", "delay jumps"]),
        ("echo-only frames voiced (%)", ["voiced_pct"], None),
        ("near end kept (correlation)", ["dt_corr", "cut_corr"], ["double talk", "after the cut"]),
        ("CPU per stream (ms per s)", ["cpu_ms_per_s"], None),
    ]
    x = np.arange(len(names))
    for ax, (title, keys, labels) in zip(axes, panels, strict=True):
        width = 0.8 / len(keys)
        for j, key in enumerate(keys):
            ax.bar(x + j * width - 0.4 + width / 2, [r[key] for r in rows], width, label=labels[j] if labels else None)
        ax.set_xticks(x, names, rotation=20, fontsize=8)
        ax.set_title(title, fontsize=10)
        if labels:
            ax.legend(fontsize=7)
    fig.suptitle(f"Server-side echo cancellation, {answers} Piper answers, real near-end speech (tools/bench_echo.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=int, default=51)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--plot", type=Path, default=REPO / "docs" / "bench-echo.png")
    args = parser.parse_args(argv)
    trials = sessions(args.answers, args.seed)
    total = sum(t.mic.size for t, _ in trials) / RATE
    print(f"{len(trials)} sessions, {args.answers} answers, {total:.0f} s of microphone audio")
    from tests.human_speech import default_dir, load_clips

    speech = load_clips(default_dir())[0][1].astype(np.float32)
    rows = []
    for name in args.candidates.split(","):
        run = CANDIDATES[name]
        try:
            lag = latency(run, speech)
        except ImportError as exc:  # livekit and speexdsp are not dependencies: pip install them
            print(f"  skipped {name}: {exc}")
            continue
        rows.append(measure(name, run, trials, lag))
        print(f"  measured {name}", flush=True)
    header = (
        f"{'candidate':23s} {'ERLE':>6s} {'const':>6s} {'jump':>6s} {'voiced%':>8s} {'run ms':>7s} "
        f"{'DT corr':>8s} {'(min)':>6s} {'cut corr':>8s} {'(min)':>6s} {'CPU ms/s':>9s} {'lat ms':>7s}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['name']:23s} {r['erle_db']:6.1f} {r['erle_const_db']:6.1f} {r['erle_jump_db']:6.1f} "
            f"{r['voiced_pct']:8.1f} {r['longest_run_ms']:7d} {r['dt_corr']:8.2f} {r['dt_corr_min']:6.2f} "
            f"{r['cut_corr']:8.2f} {r['cut_corr_min']:6.2f} {r['cpu_ms_per_s']:9.1f} {r['latency_ms']:7.1f}"
        )
    plot(rows, args.plot, args.answers)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

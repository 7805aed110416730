#!/usr/bin/env python3
"""Delay jumps: what AEC3 keeps after one, alone, with the server's tracker, and at best.

docs/echo.md (Limits): after the echo's delay changes, AEC3 alone needs seconds of echo to find the
new delay. The server's ``DelayTracker`` (audio/echo_delay.py, ``echo_delay_track_s``) finds it by
GCC-PHAT and shifts the reference so that AEC3 keeps seeing the delay it converged on. This
measures, on bench_echo.py's sessions with a jump (tests/echo_room.py, the server's
``EchoCanceller`` in 20 ms pieces):

- **ERLE and echo frames webrtcvad still voices after the jump**: the reference as played (AEC3
  alone), the server's tracker at its default settings, and the reference re-aligned at the jump
  itself by the true change (an oracle: the ceiling);
- **finding the jump**: GCC-PHAT between the microphone and the reference over the last
  ``--window-s`` of audio every ``--hop-s``: how long after a jump its estimate lands within 2 ms of
  the new delay, and how often a window with the reference sounding is wrong elsewhere.

    python tools/echo_delay_track.py [--sessions 16] [--plot bench-results/echo-delay-track.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from mediaserver.audio.echo_delay import gcc_phat  # noqa: E402
from tests import echo_room as room  # noqa: E402
from tests.echo_room import RATE, Audio, Trial  # noqa: E402

PIECE = 320
MAX_DELAY_S = 0.5


def cancel(
    mic: Audio, reference: Audio, *, track: bool = False, window_s: float | None = None
) -> tuple[Audio, int, int | None]:
    """The server's canceller, without its delay tracker or (``track``) with it (audio/echo_delay.py,
    a 1 s window): the output, how often the tracker moved the reference, and the sample where it
    last did."""
    from mediaserver.audio.echo import OUTPUT_LATENCY_SAMPLES, EchoCanceller
    from mediaserver.audio.echo_delay import TRACK_MAX_DELAY_MS, TRACK_WINDOW_S, DelayTracker

    tracker = DelayTracker(window_s or TRACK_WINDOW_S, TRACK_MAX_DELAY_MS) if track else None
    ec = EchoCanceller(tracker=tracker)
    ec.played(reference, 0)
    out = np.concatenate([ec.process(mic[i : i + PIECE]) for i in range(0, mic.size, PIECE)])
    out = np.concatenate([out[OUTPUT_LATENCY_SAMPLES:], np.zeros(OUTPUT_LATENCY_SAMPLES, np.float32)])
    return out, 0 if tracker is None else tracker.shifts, ec.shifted_at


def realigned(trial: Trial) -> Audio:
    """The reference as AEC3 would need it to see the first delay throughout: after each change,
    shifted by the change (later where the echo now comes later)."""
    first = trial.delays[0][1]
    out = trial.reference.copy()
    for i, (start, delay) in enumerate(trial.delays[1:], start=1):
        end = trial.delays[i + 1][0] if i + 1 < len(trial.delays) else out.size
        shift = delay - first
        src = np.arange(start, end) - shift
        ok = (src >= 0) & (src < trial.reference.size)
        out[start:end] = 0.0
        out[start:end][ok] = trial.reference[src[ok]]
    return out


def track(trial: Trial, window_s: float, hop_s: float, min_sharpness: float) -> list[tuple[int, int | None]]:
    """(end sample, estimated delay or None) for each window whose reference sounds."""
    window, hop, max_lag = int(window_s * RATE), int(hop_s * RATE), int(MAX_DELAY_S * RATE)
    estimates: list[tuple[int, int | None]] = []
    for end in range(window, trial.mic.size, hop):
        ref = trial.reference[end - window : end]
        if room.rms(ref) < 0.01:
            continue
        lag, sharp, _ = gcc_phat(trial.mic[end - window : end], ref, max_lag)
        estimates.append((end, lag if sharp >= min_sharpness else None))
    return estimates


def after_jump(trial: Trial) -> int:
    return trial.delays[1][0]


def measure(out: Audio, trial: Trial, start: int) -> tuple[float, float]:
    """ERLE (dB) and echo-only frames voiced (%) from ``start`` on."""
    n = out.size // room.VAD_FRAME
    echo_only, _ = trial.frames()
    echo_only = echo_only[:n].copy()
    echo_only[: start // room.VAD_FRAME] = False
    erle = room.erle_db(trial.mic, out, echo_only)
    vad = room.voiced(out)[:n]
    return erle, 100.0 * float(vad[echo_only].mean()) if echo_only.any() else float("nan")


def main() -> None:
    import bench_echo

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=16, help="sessions of three answers (half with a jump)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--hop-s", type=float, default=0.25)
    parser.add_argument("--min-sharpness", type=float, default=8.0)
    parser.add_argument("--track-window-s", type=float, default=None, help="the tracker's (echo_delay_track_s)")
    parser.add_argument("--plot", default="bench-results/echo-delay-track.png")
    args = parser.parse_args()
    trials = [t for t, jump in bench_echo.sessions(args.sessions * 3, args.seed) if jump]
    rows = []
    tracked_rows: list[tuple[tuple[float, float], int]] = []
    found_after: list[float] = []
    shifted_after: list[float] = []  # the server's tracker: its last shift, after the jump
    wrong = total = wrong_confirmed = total_confirmed = 0
    for k, trial in enumerate(trials):
        jump_at = after_jump(trial)
        plain = measure(cancel(trial.mic, trial.reference)[0], trial, jump_at)
        oracle = measure(cancel(trial.mic, realigned(trial))[0], trial, jump_at)
        old, new = trial.delays[0][1], trial.delays[1][1]
        estimates = track(trial, args.window_s, args.hop_s, args.min_sharpness)
        out, shifts, shifted_at = cancel(trial.mic, trial.reference, track=True, window_s=args.track_window_s)
        tracking = measure(out, trial, jump_at)
        found = None
        previous: int | None = None
        for end, lag in estimates:
            # Confirmed: the window before said the same (within 2 ms); a tracker would act on these.
            confirmed = lag is not None and previous is not None and abs(lag - previous) <= RATE // 500
            previous = lag
            start = end - int(args.window_s * RATE)
            truth = old if end <= jump_at else (new if start >= jump_at else None)  # (astride the jump: either)
            if lag is not None and truth is not None:
                total += 1
                wrong += abs(lag - truth) > RATE // 500
                if confirmed:
                    total_confirmed += 1
                    wrong_confirmed += abs(lag - truth) > RATE // 500
            if found is None and end > jump_at and confirmed and lag is not None and abs(lag - new) <= RATE // 500:
                found = (end - jump_at) / RATE
        if not (np.isfinite(plain[0]) and np.isfinite(oracle[0])):
            print(f"session {k:2d}: no echo after the jump: left out", flush=True)
            continue
        found_after.append(found if found is not None else float("nan"))
        if shifted_at is not None and shifted_at > jump_at:
            shifted_after.append((shifted_at - jump_at) / RATE)
        rows.append((k, old * 1000 // RATE, new * 1000 // RATE, plain, oracle, found))
        tracked_rows.append((tracking, shifts))
        print(
            f"session {k:2d}: delay {old * 1000 // RATE:3d} -> {new * 1000 // RATE:3d} ms  "
            f"ERLE after the jump {plain[0]:5.1f} dB (voiced {plain[1]:4.1f} %), re-aligned {oracle[0]:5.1f} dB "
            f"(voiced {oracle[1]:4.1f} %), tracked {tracking[0]:5.1f} dB (voiced {tracking[1]:4.1f} %, "
            f"{shifts} shifts)  new delay confirmed after {'-' if found is None else f'{found:.2f} s'}",
            flush=True,
        )
    print(
        f"the server's tracker (audio/echo_delay.py, echo_delay_track_s 1): ERLE after the jump median "
        f"{np.median([t[0][0] for t in tracked_rows]):.1f} dB, echo frames voiced "
        f"{np.mean([t[0][1] for t in tracked_rows]):.1f} %, {sum(t[1] for t in tracked_rows)} shifts in all; the "
        f"reference moved {np.median(shifted_after) if shifted_after else float('nan'):.2f} s after the jump "
        f"(median of {len(shifted_after)}; {min(shifted_after, default=float('nan')):.2f}-"
        f"{max(shifted_after, default=float('nan')):.2f} s)"
    )
    plain_erle = [r[3][0] for r in rows]
    oracle_erle = [r[4][0] for r in rows]
    plain_voiced = [r[3][1] for r in rows]
    oracle_voiced = [r[4][1] for r in rows]
    print(
        f"\n{len(rows)} sessions with a jump: ERLE after it, median {np.median(plain_erle):.1f} dB as played, "
        f"{np.median(oracle_erle):.1f} dB re-aligned at the jump; echo frames voiced {np.mean(plain_voiced):.1f} % "
        f"against {np.mean(oracle_voiced):.1f} %"
    )
    times = [f for f in found_after if not np.isnan(f)]
    print(
        f"GCC-PHAT ({args.window_s:g} s windows every {args.hop_s:g} s): the new delay found in {len(times)} of "
        f"{len(rows)} sessions, after {np.median(times) if times else float('nan'):.2f} s median, "
        f"{max(times) if times else float('nan'):.2f} s max (two windows agreeing); {wrong} of {total} sharp windows "
        f"wrong by over 2 ms, {wrong_confirmed} of {total_confirmed} confirmed by the window before"
    )
    plot(rows, [t[0][0] for t in tracked_rows], args.plot)


def plot(
    rows: list[tuple[int, int, int, tuple[float, float], tuple[float, float], float | None]],
    tracked_erle: list[float],
    path: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    x = np.arange(len(rows))
    axes[0].bar(x - 0.27, [r[3][0] for r in rows], 0.27, label="reference as played")
    axes[0].bar(x, tracked_erle, 0.27, label="the server's delay tracker")
    axes[0].bar(x + 0.27, [r[4][0] for r in rows], 0.27, label="re-aligned at the jump (oracle)")
    axes[0].set_title("ERLE after the delay jump (dB)")
    axes[0].set_xticks(x, [f"{r[1]}→{r[2]}" for r in rows], rotation=60, fontsize=7)
    axes[0].legend(fontsize=8)
    axes[1].bar(x, [r[5] if r[5] is not None else 0 for r in rows], 0.6)
    axes[1].set_title("GCC-PHAT: new delay confirmed after (s; 0 = never)")
    axes[1].set_xticks(x, [f"{r[1]}→{r[2]}" for r in rows], rotation=60, fontsize=7)
    fig.suptitle("echo delay jumps (tools/echo_delay_track.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The barge-in word check's residual-echo rule, on a simulated device (issue #37).

``assistant_barge_in_echo_removed_db`` (docs/echo.md): over a paused answer, an utterance whose
words are not the answer's but that the server's echo canceller took that much out of (the median
over its 10 ms frames with sound of the microphone's energy over the canceller's output) is taken
for the canceller's residual echo and not answered. The live tests saw leaks at 1.7-13.8 dB and one
person's long barge-in ("go forward ten meters") at 0.6-1.2 dB. This measures both sides on more
cases than the live tests can run:

  - **leaks**: the voiced runs (webrtcvad mode 3, 90 ms or longer) of the canceller's output over
    the first 2.5 s of a session's first answer, no person speaking: the echo AEC3 lets through
    while it converges, which is what starts an utterance over the answer;
  - **short barge-ins**: a person says a short command ("Stop.", "Wait.", the suite's real "Eight of
    spades"-style card recordings) during the first answer (AEC3 converging) or the third (converged);
    the answer is cut 0.4 s after they start, so the whole word is said over its echo;
  - **long barge-ins**: the suite's real sentences, the same way.

Each case is measured as the session would at the end of the utterance (0.3 s after its last voiced
frame): ``removed_db`` over the utterance, and, as a candidate second measure, the *likeness*: the
correlation of the microphone's 10 ms levels (dB, from -70 dBFS) with the reference's at the delay
(0-500 ms) where it is highest, over the utterance and 0.3 s before it (the echo follows the
answer's syllables whatever the canceller made of it; a person does not).

``tests/echo_room.py`` simulates the device: clipping loudspeaker, synthetic room (RT60 0.3 s), a
20-300 ms delay, echo at 0.04-0.12 RMS, the person at 0.07 RMS.

Usage:
    python tools/bench_echo_residual.py [--seeds 36] [--plot docs/bench-echo-residual.png]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mediaserver.audio.echo import EchoCanceller  # noqa: E402
from mediaserver.config import Settings  # noqa: E402
from tests import echo_room as room  # noqa: E402
from tests.echo_room import RATE, Audio, Trial  # noqa: E402

ANSWERS = (
    "The weather in Paris today is sunny with a high of twenty two degrees.",
    "I have set a timer for ten minutes. Let me know if you need anything else.",
    "The capital of Australia is Canberra, not Sydney as many people think.",
)
SHORT_PIPER = ("Stop.", "Wait.", "No, stop.", "Thanks.")
LONG_REAL = ("goforward", "forever_2", "something", "forever_4", "librivox_0870", "librivox_0880")
PERSON_RMS = 0.07
AFTER_S = 0.3  # the utterance is judged this long after its last voiced frame (the hangover)
LIKENESS_MAX_LAG_MS = 500
LIKENESS_LEAD_MS = 300
FLOOR_DBFS = -70.0
MIN_RUN_FRAMES = 3  # 90 ms of webrtcvad frames


@dataclass(frozen=True)
class Case:
    group: str  # "leak", "short", "long"
    label: str
    removed_db: float | None
    likeness: float | None


def levels_db(x: Audio) -> np.ndarray:
    n = x.size // 160
    power = np.mean(np.square(x[: n * 160].reshape(n, 160), dtype=np.float64), axis=1)
    levels: np.ndarray = 10.0 * np.log10(np.maximum(power, 10.0 ** (FLOOR_DBFS / 10.0)))
    return levels


def likeness(trial: Trial, start: int, end: int) -> float | None:
    """The microphone's levels against the reference's over ``start``-``end`` (samples, and
    ``LIKENESS_LEAD_MS`` before), at the best delay; None where the reference does not vary."""
    mic, ref = levels_db(trial.mic), levels_db(trial.reference)
    lo, hi = max(0, start // 160 - LIKENESS_LEAD_MS // 10), end // 160
    best: float | None = None
    for lag in range(0, min(lo, LIKENESS_MAX_LAG_MS // 10) + 1):
        a, b = mic[lo:hi], ref[lo - lag : hi - lag]
        if np.ptp(a) < 1.0 or np.ptp(b) < 1.0:
            continue
        r = float(np.corrcoef(a, b)[0, 1])
        best = r if best is None else max(best, r)
    return best


def measure(trial: Trial, spans: list[tuple[int, int]]) -> list[tuple[float | None, float | None]]:
    """Run the canceller over the trial in 20 ms pieces, as a stream does; each span's measures once
    the stream is ``AFTER_S`` past its end."""
    ec = EchoCanceller()
    ec.played(trial.reference, 0)
    due = sorted((end + int(AFTER_S * RATE), start, end) for start, end in spans)
    out: list[tuple[float | None, float | None]] = []
    position = 0
    while position < trial.mic.size and due:
        ec.process(trial.mic[position : position + 320])
        position += 320
        while due and position >= due[0][0]:
            _, start, end = due.pop(0)
            now_ms = position * 1000 // RATE
            removed = ec.removed_db(now_ms - start * 1000 // RATE, now_ms - end * 1000 // RATE)
            out.append((removed, likeness(trial, start, end)))
    return out


def voiced_runs(trial: Trial, until: int) -> list[tuple[int, int]]:
    """The voiced runs of the canceller's output before sample ``until`` (what would start an utterance)."""
    ec = EchoCanceller()
    ec.played(trial.reference, 0)
    out = np.concatenate([ec.process(trial.mic[i : i + 320]) for i in range(0, trial.mic.size, 320)])
    voiced, frame = room.voiced(out), room.VAD_FRAME
    runs: list[tuple[int, int]] = []
    i = 0
    while i < min(voiced.size, until // frame):
        j = i
        while j < voiced.size and voiced[j]:
            j += 1
        if j - i >= MIN_RUN_FRAMES:
            runs.append((i * frame, j * frame))
        i = max(j, i + 1)
    return runs


def barge_ins(
    people: list[tuple[str, Audio]], answers: list[Audio], seeds: int
) -> list[tuple[str, Trial, tuple[int, int]]]:
    """Each seed's person (in turn) barging in over the first answer (converging) or the third
    (converged), each clip both ways, the answer cut 0.4 s after they begin: the label, the trial and
    the person's voiced span in it (samples). Shared with echo_stock_phrases.py."""
    from tests.human_speech import voiced_span

    out: list[tuple[str, Trial, tuple[int, int]]] = []
    for seed in range(seeds):
        name, audio = people[seed % len(people)]
        near = (audio / room.rms(audio) * PERSON_RMS).astype(np.float32)
        lo, hi = voiced_span(near)
        first = (seed // len(people)) % 2 == 0
        rng = np.random.default_rng(1000 + seed)
        trial = room.simulate(
            answers[:1] if first else answers, rng, near=near, delays_ms=[rng.uniform(20, 300)], cut_after_s=0.4
        )
        assert trial.barge_at is not None
        where = "first answer" if first else "third answer"
        out.append((f"{name} ({where})", trial, (trial.barge_at + lo, trial.barge_at + hi)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=36, help="sessions per group")
    parser.add_argument(
        "--threshold-db", type=float, default=Settings(_env_file=None).assistant_barge_in_echo_removed_db
    )
    parser.add_argument("--likeness", type=float, default=0.75, help="the candidate likeness threshold")
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()

    from tests.conftest import synthesize
    from tests.human_speech import default_dir, load_clips

    answers = [synthesize(text).audio16k.astype(np.float32) for text in ANSWERS]
    clips = {name: audio for name, audio, _ in load_clips(default_dir())}
    short = [(t, synthesize(t).audio16k.astype(np.float32)) for t in SHORT_PIPER]
    short += [(name, audio) for name, audio in clips.items() if name.startswith("cards")]
    long = [(name, clips[name]) for name in LONG_REAL if name in clips]

    cases: list[Case] = []
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        trial = room.simulate([answers[seed % 3]], rng, delays_ms=[rng.uniform(20, 300)], cut_after_s=None)
        first_answer = int(0.5 * RATE)
        runs = voiced_runs(trial, first_answer + int(2.5 * RATE))
        for (start, _end), (removed, like) in zip(runs, measure(trial, runs), strict=True):
            cases.append(Case("leak", f"seed {seed} at {start / RATE:.2f} s", removed, like))
    for group, people in (("short", short), ("long", long)):
        if not people:
            raise SystemExit(f"no {group} clips (tests/human_speech.py's recordings are missing)")
        for label, trial, span in barge_ins(people, answers, args.seeds):
            [(removed, like)] = measure(trial, [span])
            cases.append(Case(group, label, removed, like))

    rule = f"removed >= {args.threshold_db:g} dB"
    print(f"{len(cases)} cases; the rule: {rule}; candidate: likeness >= {args.likeness:g}")
    print("taken for echo by:")
    print(f"{'group':<7} {'cases':>5} {'no measure':>10} {'the rule':>12} {'likeness':>12} {'both':>12}")
    for group in ("leak", "short", "long"):
        mine = [c for c in cases if c.group == group]
        by_db = [c.removed_db is not None and c.removed_db >= args.threshold_db for c in mine]
        by_like = [c.likeness is not None and c.likeness >= args.likeness for c in mine]
        both = [a and b for a, b in zip(by_db, by_like, strict=True)]
        none = sum(c.removed_db is None for c in mine)
        cells = " ".join(f"{sum(x):>5} ({100 * sum(x) / max(1, len(mine)):3.0f} %)" for x in (by_db, by_like, both))
        print(f"{group:<7} {len(mine):>5} {none:>10} {cells}")
    for group in ("leak", "short", "long"):
        measured = sorted(c.removed_db for c in cases if c.group == group and c.removed_db is not None)
        if measured:
            print(f"{group}: removed {measured[0]:.1f}-{measured[-1]:.1f} dB (median {np.median(measured):.1f})")
    wrong = [c for c in cases if c.group != "leak" and c.removed_db is not None and c.removed_db >= args.threshold_db]
    for c in wrong:
        print(f"  taken for echo by the rule: {c.label}: {c.removed_db:.1f} dB, likeness {c.likeness}")
    if args.plot is not None:
        plot(cases, args.threshold_db, args.likeness, args.plot)


def plot(cases: list[Case], threshold_db: float, like: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    styles = {"leak": ("tab:red", "echo leak (no person)"), "short": ("tab:blue", "short barge-in")}
    styles["long"] = ("tab:green", "long barge-in")
    for group, (color, label) in styles.items():
        points = [(c.removed_db, c.likeness) for c in cases if c.group == group and c.removed_db is not None]
        points = [(x, y if y is not None else 0.0) for x, y in points]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.scatter(xs, ys, s=18, color=color, label=label, alpha=0.7)
    ax.axvline(threshold_db, color="black", linestyle="--", linewidth=1, label=f"removed_db rule ({threshold_db:g} dB)")
    ax.axhline(like, color="grey", linestyle=":", linewidth=1, label=f"likeness {like:g}")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(left=0.0)
    ax.set_xlabel("removed by the canceller over the utterance (dB, median over frames)")
    ax.set_ylabel("likeness to the answer (correlation of levels)")
    ax.set_title("The residual-echo rule on a simulated device (bench_echo_residual.py)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()

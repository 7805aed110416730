#!/usr/bin/env python3
"""Long answers on a device without echo cancellation, live: what its user hears of them (issue #37,
docs/echo.md "Suspect starts").

A device whose loudspeaker its microphone hears (``EchoingDevice`` of tests/integration/test_echo_loop.py:
150 ms late, gain 0.7, a room and a loudspeaker that clips; 20 ms microphone frames in real time)
asks ``python -m mediaserver`` for long answers over the device WebSocket, one after the other has
played and died away, nobody speaking over them. Every start over an answer is then the answer's own
echo, and the arms differ in what it costs the answer:

- **answers cut**: ``assistant_audio_stopped`` with ``interrupted``;
- **holes**: stretches of 0.3 s or more inside an answer where the loudspeaker had nothing to play
  (a pause of the answer for speech over it, or the server falling behind), and their seconds;
- **dips**: suspect starts the answer played on through, quieter, that came to nothing
  (``assistant_barge_in_echo_duck_db``; the server's log); **pauses**: ``assistant_audio_paused``;
- **errors**: answers that failed (an ``error`` before their stop; not counted as answers);
- the characters of answer heard (SmolLM2 samples: the answers' lengths vary, so holes are also
  counted per 100 characters).

    python tools/echo_long_answers.py [--sessions 2] [--questions 6] [--arms pause=0,duck=20]
        [--setting assistant_barge_in_echo_duck_db] [--plot PNG]

Each arm is ``NAME=VALUE`` of ``--setting``; the other settings are the defaults. Each session is one
server started afresh with its arm's setting, the arms alternating. About 6 minutes a session of six
questions on the dev container.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import aiohttp  # noqa: E402
import numpy as np  # noqa: E402
from benchlib import child_server  # noqa: E402
from echo_live_jump import wait_ready  # noqa: E402

from mediaserver.events import AudioArray  # noqa: E402

QUESTIONS = (
    "Tell me about the history of Rome.",
    "Explain how bees make honey.",
    "What do cows eat?",
    "Tell me a long story about a dragon.",
    "Explain how the moon causes the tides.",
    "Tell me about the history of the printing press.",
)
HOLE_S = 0.3  # the loudspeaker silent this long inside an answer is a hole
QUIET_S = 2.0  # nothing played or said this long: the next question
ANSWER_TIMEOUT_S = 400.0
DUCKED, NOTHING = "dB quieter until it is long enough", "came to nothing: played on"
GAIN, DELAY_S = 0.7, 0.15


@dataclass
class Arm:
    name: str
    value: str  # the arm's value of --setting
    answers: int = 0
    cut: int = 0
    holes: list[float] = field(default_factory=list)  # seconds each
    dips: int = 0
    pauses: int = 0
    chars: int = 0
    errors: int = 0

    def add(self, session: dict[str, Any], dips: int) -> None:
        self.answers += session["answers"]
        self.cut += session["cut"]
        self.holes += session["holes"]
        self.pauses += session["pauses"]
        self.chars += session["chars"]
        self.errors += session["errors"]
        self.dips += dips


def dips(log: str) -> int:
    """The ducked starts that came to nothing (the answer played on through them), from the log."""
    count, ducked = 0, False
    for line in log.splitlines():
        if DUCKED in line:
            ducked = True
        elif NOTHING in line:
            count += ducked
            ducked = False
        elif "pausing it" in line:
            ducked = False  # long enough: it paused the answer (a hole, if it played so long)
    return count


async def session(url: str, clips: dict[str, AudioArray]) -> dict[str, Any]:
    """One device session: each question asked once the answer before has played and died away."""
    import tests.integration.test_echo_loop as loop

    assert (loop.DELAY_S, loop.GAIN) == (DELAY_S, GAIN), "the device this tool's figures were measured on"
    ticks: list[tuple[float, int]] = []  # (when, answer samples the loudspeaker played in that 20 ms)

    class Device(loop.EchoingDevice):
        def _play(self) -> np.ndarray:
            before = self.played_samples
            out = super()._play()
            ticks.append((time.monotonic(), self.played_samples - before))
            return out

    def in_answer(device: loop.EchoingDevice) -> bool:
        kinds = [m["type"] for m in device.messages]
        return kinds.count("assistant_audio_started") > kinds.count("assistant_audio_stopped")

    stop = asyncio.Event()
    answers: list[tuple[float, float, dict[str, Any]]] = []  # (started, stopped, the stop message)
    errors = 0
    ws_url = url.replace("http://", "ws://") + "/api/ws/asr"
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        device = Device(ws, gain=GAIN)
        reader = asyncio.create_task(device.read())
        await ws.send_str(json.dumps({"type": "start", "mode": "server_vad", "assistant": True}))
        await device.until("ready", 0)
        microphone = asyncio.create_task(device.run_microphone(stop))

        def quiet() -> bool:
            last = max(device.frames_at[-1:] + device.message_at[-1:], default=0.0)
            return (
                device.speaker_idle and device.settled and not in_answer(device) and time.monotonic() - last > QUIET_S
            )

        try:
            for question in QUESTIONS[: len(clips)]:
                await device.condition(quiet, timeout_s=ANSWER_TIMEOUT_S)
                mark = len(device.messages)
                device.say(clips[question])
                started = await device.until("assistant_audio_started", mark, timeout_s=120.0)
                if started["type"] != "assistant_audio_started":
                    errors += 1
                    continue
                at = device.message_at[device.messages.index(started, mark)]
                stopped = await device.until("assistant_audio_stopped", mark, timeout_s=ANSWER_TIMEOUT_S)
                if stopped["type"] == "error":
                    errors += 1
                    print(f"  {question!r}: error {stopped}", flush=True)
                    continue
                answers.append((at, device.message_at[device.messages.index(stopped, mark)], stopped))
                print(f"  {question!r}: {'cut' if stopped.get('interrupted') else 'played'}", flush=True)
            await device.condition(quiet, timeout_s=ANSWER_TIMEOUT_S)
        finally:
            stop.set()
            await microphone
            reader.cancel()
        pauses = sum(m["type"] == "assistant_audio_paused" for m in device.messages)
    holes: list[float] = []
    for begun, ended, _ in answers:
        played = [n for t, n in ticks if begun <= t <= ended]
        first = next((i for i, n in enumerate(played) if n), len(played))
        run = 0
        for n in [*played[first:], 1]:  # (the stop ends a run)
            if n:
                if run * loop.TICK / loop.RATE >= HOLE_S:
                    holes.append(run * loop.TICK / loop.RATE)
                run = 0
            else:
                run += 1
    return {
        "answers": len(answers),
        "cut": sum(bool(stop.get("interrupted")) for _, _, stop in answers),
        "holes": holes,
        "pauses": pauses,
        "chars": sum(len(stop.get("heard") or "") for _, _, stop in answers),
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=2, help="sessions per arm (the arms alternate)")
    parser.add_argument("--questions", type=int, default=len(QUESTIONS), help="questions a session")
    parser.add_argument("--arms", default="pause=0,duck=20", help="NAME=VALUE of --setting, comma-separated")
    parser.add_argument("--setting", default="assistant_barge_in_echo_duck_db", help="the setting the arms vary")
    parser.add_argument("--plot", default="bench-results/echo-long-answers.png")
    args = parser.parse_args()
    arms = [Arm(name, value) for name, value in (item.split("=") for item in args.arms.split(","))]
    from tests.conftest import synthesize

    clips = {question: synthesize(question).audio16k for question in QUESTIONS[: args.questions]}
    for run in range(args.sessions):
        for arm in arms:
            env = {f"MEDIASERVER_{args.setting.upper()}": arm.value}
            log = REPO / "bench-results" / f"echo-long-answers-{arm.name}-{run}.log"
            with child_server(log, 600.0, env, log_level="INFO") as (url, _):
                wait_ready(url)
                print(f"{arm.name} session {run}:", flush=True)
                result = asyncio.run(session(url, clips))
            arm.add(result, dips(log.read_text(errors="replace")))
            print(
                f"{arm.name} session {run}: {result['cut']} of {result['answers']} answers cut, "
                f"{len(result['holes'])} holes ({sum(result['holes']):.1f} s), {result['pauses']} pauses, "
                f"{result['chars']} characters heard, {result['errors']} errors",
                flush=True,
            )
    device = f"device {DELAY_S * 1000:g} ms late, gain {GAIN}"
    print(f"\n{args.sessions} sessions of {args.questions} long answers an arm; {device}")
    print(
        f"{'arm':10s} {'value':>6s} {'cut':>9s} {'holes':>6s} {'hole s':>7s} {'/100 ch':>8s} {'dips':>5s} "
        f"{'pauses':>6s} {'chars':>6s} {'errors':>6s}"
    )
    for arm in arms:
        print(
            f"{arm.name:10s} {arm.value:>6s} {arm.cut:3d} of {arm.answers:<3d} {len(arm.holes):6d} "
            f"{sum(arm.holes):7.1f} {100 * len(arm.holes) / max(arm.chars, 1):8.2f} {arm.dips:5d} "
            f"{arm.pauses:6d} {arm.chars:6d} {arm.errors:6d}"
        )
    base = arms[0]
    for arm in arms[1:]:
        ratio = sum(arm.holes) / sum(base.holes) if base.holes else float("nan")
        print(f"{arm.name} / {base.name}: seconds of holes x{ratio:.2f}")
    plot(arms, args.plot, args.setting)


def plot(arms: list[Arm], path: str, setting: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.8))
    names = [f"{arm.name}: {arm.cut} of {arm.answers} cut\n({setting} {arm.value})" for arm in arms]
    x = np.arange(len(arms))
    axis.bar(x - 0.27, [len(a.holes) for a in arms], 0.27, label="holes (count)")
    axis.bar(x, [sum(a.holes) for a in arms], 0.27, label="holes (seconds)")
    axis.bar(x + 0.27, [a.dips for a in arms], 0.27, label="dips (count)")
    axis.set_xticks(list(x), names)
    axis.set_title("long answers on a device without echo cancellation (150 ms, gain 0.7)")
    axis.legend()
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()

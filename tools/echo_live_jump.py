#!/usr/bin/env python3
"""The echo's delay jumping mid-answer, live: the server's voice loop over the device WebSocket,
with and without the delay tracker (issue #37, docs/echo.md "The delay tracker").

echo_delay_track.py measures the tracker offline, on the canceller alone. This runs it as a device
meets it: ``python -m mediaserver`` on its defaults (one child per arm, the arm's settings in its
environment), and a device without echo cancellation (``EchoingDevice`` of
tests/integration/test_echo_loop.py: a loudspeaker that clips, a room, gain 0.7) whose microphone
hears its own answers 60 ms late, until the delay jumps to ``--jump-ms`` one second into the second
answer (a player that starts buffering more). Each run asks three questions (Piper), one after the
other answer has played and died away, and counts:

- **answers cut**: ``assistant_audio_stopped`` with ``interrupted`` (no person spoke over them:
  every cut is the answer's own echo taken for a barge-in);
- **extra finals**: finals beyond the question's own (what the echo made Whisper write);
- the tracker's moves (``mediaserver_echo_delay_changes_total``).

    python tools/echo_live_jump.py [--runs 6] [--jump-ms 260] [--arms off=0,tracked=1] [--setting NAME] [--plot PNG]

Each arm is ``NAME=VALUE``: ``--setting`` (``echo_delay_track_s`` unless named) for its server. About 1 minute per
arm to start and 35 s a run on the dev container.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import aiohttp  # noqa: E402
from benchlib import child_server, get_json  # noqa: E402

from mediaserver.events import AudioArray  # noqa: E402

QUESTIONS = ("What do cows eat?", "Tell me about bees.", "What do horses eat?")
FIRST_DELAY_S = 0.06
STARTUP_TIMEOUT_S = 600.0


@dataclass
class Arm:
    name: str
    value: str  # the arm's value of --setting
    cut: list[int] = field(default_factory=list)  # answers cut, per run
    extra: list[int] = field(default_factory=list)  # extra finals, per run
    moved: int = 0
    followed: int = 0
    logged: dict[str, int] = field(default_factory=dict)  # the server's log lines of LOGGED, counted


# What the server logs of starts over the answer (stream/barge_in.py), counted per arm.
LOGGED = {
    "ducked": "dB quieter until it is long enough",
    "ducked, not suspect": "a start (not suspect) over the answer",
    "came to nothing": "came to nothing: played on",
    "cut at the start": ": cut",
    "paused": "pausing it",
    "not suspect, quiet before its duck's reach": "went quiet before its duck could be heard",
}


async def run_once(url: str, jump_s: float, clips: dict[str, AudioArray]) -> tuple[int, int, list[list[str]]]:
    """One session of three questions; the delay jumps 1 s into the second answer."""
    import tests.integration.test_echo_loop as loop

    stop = asyncio.Event()
    cut = extra = 0
    finals_by_turn: list[list[str]] = []
    ws_url = url.replace("http://", "ws://") + "/api/ws/asr"
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url) as ws:
        loop.DELAY_S = max(jump_s, FIRST_DELAY_S)  # the loudspeaker's history, long enough for either delay
        device = loop.EchoingDevice(ws)
        loop.DELAY_S = FIRST_DELAY_S
        reader = asyncio.create_task(device.read())
        await ws.send_str(json.dumps({"type": "start", "mode": "server_vad", "assistant": True}))
        await device.until("ready", 0)
        microphone = asyncio.create_task(device.run_microphone(stop))

        def played_past(samples: int) -> Callable[[], bool]:
            return lambda: device.played_samples >= samples

        try:
            for turn, question in enumerate(QUESTIONS):
                mark = len(device.messages)
                device.say(clips[question])
                await device.until("assistant_audio_started", mark)
                if turn == 1:
                    await device.condition(played_past(device.played_samples + loop.RATE))
                    loop.DELAY_S = jump_s
                stopped = await device.until("assistant_audio_stopped", mark)
                cut += bool(stopped.get("interrupted"))
                await device.condition(lambda: device.speaker_idle and device.settled)
                finals = [m["text"] for m in device.messages[mark:] if m["type"] == "final"]
                extra += max(0, len(finals) - 1)
                finals_by_turn.append(finals)
        finally:
            stop.set()
            await microphone
            reader.cancel()
    return cut, extra, finals_by_turn


def delay_changes(url: str) -> dict[str, int]:
    """mediaserver_echo_delay_changes_total by change, from /metrics."""
    from tests.faults import metric_samples

    samples = asyncio.run(metric_samples(url))
    counts = {"moved": 0, "followed": 0}
    for (name, labels), value in samples.items():
        change = dict(labels).get("change")
        if name == "mediaserver_echo_delay_changes_total" and change in counts:
            counts[change] = int(value)
    return counts


def wait_ready(url: str) -> None:
    """The LLM and TTS loaded (``/health`` ok), not only the HTTP server up."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while (get_json(f"{url}/health") or {}).get("status") != "ok":
        if time.monotonic() > deadline:
            raise SystemExit(f"/health not ok within {STARTUP_TIMEOUT_S:g} s")
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="sessions per arm")
    parser.add_argument("--jump-ms", type=float, default=260.0, help="the delay after the jump (from 60 ms)")
    parser.add_argument("--arms", default="off=0,tracked=1", help="NAME=VALUE of --setting, comma-separated")
    parser.add_argument(
        "--setting", default="echo_delay_track_s", help="the setting the arms vary (the others: the defaults)"
    )
    parser.add_argument("--plot", default="bench-results/echo-live-jump.png")
    args = parser.parse_args()
    arms = [Arm(name, value) for name, value in (item.split("=") for item in args.arms.split(","))]
    from tests.conftest import synthesize

    clips = {question: synthesize(question).audio16k for question in QUESTIONS}
    for arm in arms:
        env = {f"MEDIASERVER_{args.setting.upper()}": arm.value}
        log = REPO / "bench-results" / f"echo-live-jump-{arm.name}.log"
        with child_server(log, STARTUP_TIMEOUT_S, env, log_level="INFO") as (url, _):
            wait_ready(url)
            for run in range(args.runs):
                cut, extra, finals = asyncio.run(run_once(url, args.jump_ms / 1000, clips))
                arm.cut.append(cut)
                arm.extra.append(extra)
                print(f"{arm.name} run {run}: answers cut {cut}, extra finals {extra}: {finals}", flush=True)
            changes = delay_changes(url)
            arm.moved, arm.followed = changes["moved"], changes["followed"]
        text = log.read_text(errors="replace")
        arm.logged = {what: text.count(line) for what, line in LOGGED.items()}
        print(f"{arm.name}: {arm.logged}", flush=True)
    answers = args.runs * len(QUESTIONS)
    print(f"\ndelay 60 -> {args.jump_ms:g} ms 1 s into the second answer; {args.runs} sessions of 3 answers per arm")
    print(f"{'arm':12s} {'value':>7s} {'answers cut':>12s} {'extra finals':>13s} {'moved':>6s} {'followed':>9s}")
    for arm in arms:
        print(
            f"{arm.name:12s} {arm.value:>7s} {sum(arm.cut):5d} / {answers:<4d} {sum(arm.extra):13d} "
            f"{arm.moved:6d} {arm.followed:9d}"
        )
    plot(arms, answers, args.jump_ms, args.plot, args.setting)


def plot(arms: list[Arm], answers: int, jump_ms: float, path: str, setting: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    names = [f"{arm.name}\n({setting} {arm.value})" for arm in arms]
    x = range(len(arms))
    axis.bar([i - 0.2 for i in x], [100 * sum(a.cut) / answers for a in arms], 0.4, label="answers cut (%)")
    axis.bar([i + 0.2 for i in x], [sum(a.extra) for a in arms], 0.4, label="extra finals (count)")
    axis.set_xticks(list(x), names)
    axis.set_title(f"live: echo delay 60 -> {jump_ms:g} ms mid-answer, {answers} answers per arm")
    axis.legend()
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()

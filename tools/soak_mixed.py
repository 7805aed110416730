"""Mixed soak (``python tools/soak.py --mixed``): every face of the server at once for 30-60 minutes;
do the server's memory, file descriptors or threads grow once it is warm?

    python tools/soak.py --mixed                                   # 30 min, a child server
    python tools/soak.py --mixed --duration-min 60 --warmup-min 10 --json soak60.json --plot soak60.png
    python tools/soak.py --mixed --duration-min 3 --warmup-min 1 --sample-s 5    # a quick check
    python tools/soak.py --mixed --url http://127.0.0.1:19001 --server-pid 1234 --wyoming-port 10300

Workers (``--mix KIND=N,...``), each doing one operation after another until the end, a seeded pause
of ``--pause-s`` between them, each operation bounded by ``--op-timeout-s``; all on loopback:

- ``upload``: a Piper sentence as WAV to ``POST /v1/audio/transcriptions``; a non-empty text;
- ``speech``: ``POST /v1/audio/speech`` (WAV) of a sentence; audio back;
- ``chat``: ``POST /v1/chat/completions``, ``max_tokens`` 24; an answer;
- ``ws``: a device WebSocket (``/api/ws/asr``, server VAD): three Piper sentences with 4.5 s pauses
  (past ``turn_wait_medium_ms``: semantic turns wait out a pause heard as unfinished that long),
  20 ms frames paced in real time; three finals, then hang up (a new socket each time);
- ``realtime``: a Realtime WebSocket session through the ``openai`` SDK with a function tool
  (``set_light``, named in ``tool_choice``, as tests/integration/test_realtime_tools.py does):
  "Turn on the kitchen light." spoken in real time with server VAD → a ``function_call``; the
  client answers it (``function_call_output``, ``response.create``) → a spoken answer;
- ``wake_ws``: a device WebSocket with ``wake: okay_nabu``: "okay nabu, turn on the lights" →
  ``wake_word`` then a final;
- ``wake_wyoming``: Wyoming ``detect`` → "okay nabu, turn on the lights" in 64 ms chunks paced in
  real time → ``detection``.

Every ``--sample-s`` the server process and its children (the llama-server engine) are sampled: RSS
(and the server's anonymous RSS, ``RssAnon``: heap rather than mapped files), open fds
(``/proc/PID/fd``), threads, and the server's open sessions (``mediaserver_sessions`` of
``/metrics``). After the traffic the run waits ``--settle-s`` and samples once more. It prints the
RSS slope after ``--warmup-min`` (MB/min, least squares over the samples between the warm-up and the
end of the traffic; fds and threads too), RSS / fds / threads at the warm-up, end of traffic and
settled, operations and errors per kind (errors by exception), latency per kind; writes ``--json``
and ``--plot`` (RSS, fds, threads and sessions over time). Exit code 1 when any operation failed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, CpuWatch, child_server, free_port, percentile

KINDS = ("upload", "speech", "chat", "ws", "realtime", "wake_ws", "wake_wyoming")
DEFAULT_MIX = "upload=1,speech=1,chat=1,ws=2,realtime=1,wake_ws=1,wake_wyoming=1"
MB = 2**20
WS_PAUSE_S = 4.5  # between a device stream's sentences
QUIET_S = 20.0  # a device stream's missing final: this long after its audio, nothing came
WAKE_PHRASE = "okay nabu, turn on the lights"
TOOL_QUESTION = "Turn on the kitchen light."
SET_LIGHT = {
    "type": "function",
    "name": "set_light",
    "description": "Turn a light on or off",
    "parameters": {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": ["kitchen", "bedroom"]}, "on": {"type": "boolean"}},
        "required": ["name", "on"],
    },
}
CHAT_QUESTIONS = (
    "What is the capital of France? One word.",
    "Name a color of the sky.",
    "How many legs does a cat have?",
    "Say hello in Spanish.",
)


@dataclass
class Sample:
    t: float  # s since the traffic started
    rss_mb: float  # the server process
    rss_anon_mb: float
    fds: int
    threads: int
    child_rss_mb: float  # its children together (the llama-server engine)
    child_fds: int
    child_threads: int
    children: int
    sessions: float  # mediaserver_sessions (all kinds) from /metrics
    tts_cache_mb: float  # mediaserver_tts_cache_bytes: bounded by tts_cache_max_bytes (64 MB), part of the RSS


@dataclass
class Tally:
    done: Counter[str] = field(default_factory=Counter)
    errors: dict[str, Counter[str]] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def error(self, kind: str, exc: BaseException) -> None:
        label = f"{type(exc).__name__}: {str(exc)[:120]}"
        self.errors.setdefault(kind, Counter())[label] += 1


class Failed(RuntimeError):
    """An operation's answer was not what it should be."""


@dataclass
class Material:
    """The audio every worker sends, made once before the clock starts (Piper, tests/conftest.py)."""

    upload_wavs: list[bytes]
    sentences: list[str]
    ws_audio: np.ndarray  # 16 kHz float: three sentences, WS_PAUSE_S pauses
    ws_sentences: int
    wake_audio: np.ndarray  # 16 kHz float: silence, the wake phrase, silence
    realtime_pcm: bytes  # 24 kHz PCM16: the tool question


def material() -> Material:
    from tests.conftest import SENTENCES, resample_to, synthesize

    clips = [synthesize(text) for text in SENTENCES.values()]
    # Past turn_wait_medium_ms (4 s): with semantic turns (the default) a pause the turn model hears as
    # unfinished is waited out that long, so a shorter one may join two sentences in one final.
    pause = np.zeros(int(16000 * WS_PAUSE_S), np.float32)
    ws_parts = [np.zeros(16000, np.float32)]
    for clip in clips[:3]:
        ws_parts += [clip.audio16k, pause]
    wake = synthesize(WAKE_PHRASE).audio16k
    wake_audio = np.concatenate([np.zeros(8000, np.float32), wake, np.zeros(int(16000 * 1.5), np.float32)])
    question = resample_to(synthesize(TOOL_QUESTION), 24000)
    return Material(
        upload_wavs=[clip.wav_bytes() for clip in clips],
        sentences=list(SENTENCES.values()),
        ws_audio=np.concatenate(ws_parts),
        ws_sentences=3,
        wake_audio=wake_audio,
        realtime_pcm=pcm16(question),
    )


def pcm16(audio: np.ndarray) -> bytes:
    return bytes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


# --- the faces -------------------------------------------------------------------------------------


class Faces:
    def __init__(self, url: str, wyoming_port: int | None, stuff: Material) -> None:
        self.url = url
        self.wyoming_port = wyoming_port
        self.m = stuff
        self.spoken = 0

    async def upload(self, rng: random.Random) -> None:
        import aiohttp

        form = aiohttp.FormData()
        form.add_field("file", rng.choice(self.m.upload_wavs), filename="speech.wav", content_type="audio/wav")
        form.add_field("model", "whisper-1")
        async with aiohttp.ClientSession() as http, http.post(f"{self.url}/v1/audio/transcriptions", data=form) as r:
            body = await r.text()
            if r.status != 200 or not json.loads(body).get("text", "").strip():
                raise Failed(f"HTTP {r.status}: {body[:200]}")

    async def speech(self, rng: random.Random) -> None:
        import aiohttp

        self.spoken += 1
        body: dict[str, Any] = {"model": "tts-1", "voice": "alloy", "response_format": "wav"}
        if self.spoken % 2:  # a phrase asked for again and again: the response cache's hit
            body["input"] = rng.choice(self.m.sentences)
        else:  # a new text each time, streamed (SSE: not cached), so synthesis runs and the cache stays as it is
            body |= {"input": f"{rng.choice(self.m.sentences)} Number {self.spoken}.", "stream_format": "sse"}
        async with aiohttp.ClientSession() as http, http.post(f"{self.url}/v1/audio/speech", json=body) as r:
            data = await r.read()
            if r.status != 200 or len(data) < 4000:
                raise Failed(f"HTTP {r.status}, {len(data)} bytes: {data[:200]!r}")

    async def chat(self, rng: random.Random) -> None:
        import aiohttp

        body = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": rng.choice(CHAT_QUESTIONS)}],
            "max_tokens": 24,
        }
        async with aiohttp.ClientSession() as http, http.post(f"{self.url}/v1/chat/completions", json=body) as r:
            text = await r.text()
            if r.status != 200 or not json.loads(text)["choices"][0]["message"].get("content"):
                raise Failed(f"HTTP {r.status}: {text[:200]}")

    async def _device(self, start: dict[str, Any], audio: np.ndarray, finals: int, wake: bool) -> None:
        """A device WebSocket (tests/integration/test_ws_stream.py's client): ``finals`` finals, no error."""
        import aiohttp

        from tests.integration.test_ws_stream import Client

        async with aiohttp.ClientSession() as http, http.ws_connect(f"{self.url}/api/ws/asr") as ws:
            client = Client(http, ws)
            sending: asyncio.Task[None] = asyncio.create_task(asyncio.sleep(0))
            try:
                await client.start(**start)
                sending = asyncio.create_task(client.send_audio(pcm16(audio), 640, realtime_bytes_per_s=32000))
                got: list[dict[str, Any]] = []
                while sum(1 for m in got if m["type"] == "final") < finals:
                    try:
                        message = await client.next(timeout=QUIET_S if sending.done() else 120)
                    except TimeoutError:
                        texts = [m["text"] for m in got if m["type"] == "final"]
                        raise Failed(
                            f"{len(texts)} finals for {finals} utterances, none {QUIET_S:g} s after the audio: {texts}"
                        ) from None
                    if message is None:
                        raise Failed(f"socket closed ({ws.close_code}) after {[m['type'] for m in got]}")
                    if message["type"] == "error":
                        raise Failed(f"error event {message}")
                    got.append(message)
                await sending
                kinds = [m["type"] for m in got]
                if wake and ("wake_word" not in kinds or kinds.index("wake_word") > kinds.index("final")):
                    raise Failed(f"no wake_word before the final: {kinds}")
            finally:
                if not sending.done():
                    sending.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError, ConnectionError):
                    await sending
                await ws.close()
                await client._reader

    async def ws(self, rng: random.Random) -> None:
        start = {"mode": "server_vad", "language": "en"}
        await self._device(start, self.m.ws_audio, self.m.ws_sentences, wake=False)

    async def wake_ws(self, rng: random.Random) -> None:
        start = {"mode": "server_vad", "language": "en", "wake": "okay_nabu"}
        await self._device(start, self.m.wake_audio, 1, wake=True)

    async def wake_wyoming(self, rng: random.Random) -> None:
        from wyoming.audio import AudioChunk, AudioStart, AudioStop
        from wyoming.client import AsyncTcpClient
        from wyoming.wake import Detect

        if self.wyoming_port is None:
            raise Failed("no Wyoming port (--wyoming-port)")
        pcm = pcm16(self.m.wake_audio)
        step = 1024 * 2  # 64 ms, as Home Assistant sends it
        client = AsyncTcpClient("127.0.0.1", self.wyoming_port)
        await client.connect()
        try:
            await client.write_event(Detect(names=["okay_nabu"]).event())
            await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            started = time.monotonic()
            for n, offset in enumerate(range(0, len(pcm), step)):
                chunk = AudioChunk(rate=16000, width=2, channels=1, audio=pcm[offset : offset + step])
                await client.write_event(chunk.event())
                await asyncio.sleep(max(0.0, started + (n + 1) * 0.064 - time.monotonic()))
            await client.write_event(AudioStop().event())
            while True:
                event = await asyncio.wait_for(client.read_event(), 30)
                if event is None:
                    raise Failed("Wyoming connection closed without a detection")
                if event.type == "detection":
                    return
                if event.type in ("not-detected", "error"):
                    raise Failed(f"Wyoming {event.type}: {event.data}")
        finally:
            await client.disconnect()

    async def realtime(self, rng: random.Random) -> None:
        import openai

        sdk: Any = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)
        async with sdk.realtime.connect(model="gpt-realtime") as connection:
            created = (await until(connection, "session.created"))[-1]
            silence_ms = created.session.audio.input.turn_detection.silence_duration_ms
            await connection.session.update(
                session={
                    "type": "realtime",
                    "instructions": "You control the lights. Answer in one short sentence.",
                    "tools": [SET_LIGHT],
                    "tool_choice": {"type": "function", "name": "set_light"},
                    "max_output_tokens": 80,
                }
            )
            await until(connection, "session.updated")
            audio = self.m.realtime_pcm + bytes(2 * int(24000 * (silence_ms / 1000 + 1.0)))
            chunk = 2 * 24000 * 40 // 1000
            started = time.monotonic()
            for n, offset in enumerate(range(0, len(audio), chunk)):
                piece = base64.b64encode(audio[offset : offset + chunk]).decode("ascii")
                await connection.input_audio_buffer.append(audio=piece)
                await asyncio.sleep(max(0.0, started + (n + 1) * 0.04 - time.monotonic()))
            events = await until(connection, "response.done", limit_s=120)
            calls = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
            if not calls:
                raise Failed(f"no function call: {[e.type for e in events]}")
            await connection.session.update(
                session={"type": "realtime", "tool_choice": "none", "max_output_tokens": 30}
            )
            await until(connection, "session.updated")
            await connection.conversation.item.create(
                item={"type": "function_call_output", "call_id": calls[0].item.call_id, "output": "The light is on."}
            )
            await until(connection, "conversation.item.done")
            await connection.response.create()
            answer = await until(connection, "response.done", limit_s=120)
            if not any(e.type == "response.output_audio.delta" for e in answer):
                raise Failed(f"no spoken answer: {[e.type for e in answer]}")


async def until(connection: Any, *kinds: str, limit_s: float = 60.0) -> list[Any]:
    """Realtime events up to the first of ``kinds``, validated by the SDK's models; an ``error`` fails."""
    from tests.integration.test_realtime_conversation import GA_EVENTS

    got: list[Any] = []
    async with asyncio.timeout(limit_s):
        while True:
            event = GA_EVENTS.validate_json(await connection.recv_bytes())
            if event.type == "error":
                raise Failed(f"error event {event.error}")
            got.append(event)
            if event.type in kinds:
                return got


# --- sampling ---------------------------------------------------------------------------------------


class Sampler:
    def __init__(self, url: str, pid: int | None) -> None:
        import psutil

        self.url = url
        self.process = psutil.Process(pid) if pid else None
        self.samples: list[Sample] = []

    async def sample(self, started: float, http: Any) -> Sample:
        import psutil

        rss = anon = float("nan")
        fds = threads = child_fds = child_threads = children = 0
        child_rss = 0.0
        with contextlib.suppress(psutil.Error):  # the server gone: NaN and zeros, and the errors say why
            rss = self.process.memory_info().rss / MB if self.process else float("nan")
            anon = rss_anon_mb(self.process.pid) if self.process else float("nan")
            fds, threads = (self.process.num_fds(), self.process.num_threads()) if self.process else (0, 0)
            for child in self.process.children(recursive=True) if self.process else []:
                with contextlib.suppress(psutil.Error):
                    child_rss += child.memory_info().rss / MB
                    child_fds += child.num_fds()
                    child_threads += child.num_threads()
                    children += 1
        sample = Sample(
            time.monotonic() - started, rss, anon, fds, threads, child_rss, child_fds, child_threads, children,
            *await self._metrics(http),
        )  # fmt: skip
        self.samples.append(sample)
        return sample

    async def run(self, started: float, period_s: float) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            while True:
                await self.sample(started, http)
                await asyncio.sleep(period_s)

    async def _metrics(self, http: Any) -> tuple[float, float]:
        """Open sessions and the TTS cache's MB, from /metrics."""
        try:
            async with http.get(f"{self.url}/metrics") as resp:
                text = await resp.text()
        except OSError:
            return float("nan"), float("nan")
        values = {
            name: float(value)
            for name, _, value in (line.rpartition(" ") for line in text.splitlines() if not line.startswith("#"))
        }
        return values.get("mediaserver_sessions", float("nan")), values.get("mediaserver_tts_cache_bytes", 0.0) / MB


def rss_anon_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least squares slope of (seconds, value) points, per minute."""
    points = [(t, v) for t, v in points if v == v]
    if len(points) < 3:
        return None
    t = np.array([p[0] for p in points]) / 60
    v = np.array([p[1] for p in points])
    return float(np.polyfit(t, v, 1)[0])


# --- the run ----------------------------------------------------------------------------------------


def parse_mix(text: str) -> dict[str, int]:
    mix = {kind: 0 for kind in KINDS}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, count = part.partition("=")
        if kind not in mix:
            raise SystemExit(f"--mix: unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
        mix[kind] = int(count or 1)
    return mix


async def soak(args: argparse.Namespace, url: str, pid: int | None, wyoming_port: int | None) -> dict[str, Any]:
    stuff = material()
    faces = Faces(url, wyoming_port, stuff)
    operations: dict[str, Callable[[random.Random], Awaitable[None]]] = {kind: getattr(faces, kind) for kind in KINDS}
    mix = parse_mix(args.mix)
    tally = Tally()
    sampler = Sampler(url, pid)
    others = CpuWatch(pid)
    started = time.monotonic()
    deadline = started + args.duration_min * 60
    others.start()
    sampling = asyncio.create_task(sampler.run(started, args.sample_s))

    async def worker(kind: str, index: int) -> None:
        rng = random.Random(f"{args.seed}-{kind}-{index}")
        await asyncio.sleep(rng.uniform(0, args.pause_s[1]))  # not all at the same instant
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                async with asyncio.timeout(args.op_timeout_s):
                    await operations[kind](rng)
            except Exception as exc:
                tally.error(kind, exc)
            else:
                tally.done[kind] += 1
                tally.seconds.setdefault(kind, []).append(time.monotonic() - began)
            await asyncio.sleep(rng.uniform(*args.pause_s))

    async def progress() -> None:
        while True:
            await asyncio.sleep(60)
            last = sampler.samples[-1] if sampler.samples else None
            errors = sum(sum(c.values()) for c in tally.errors.values())
            print(
                f"[{(time.monotonic() - started) / 60:5.1f} min] done {dict(tally.done)} errors {errors}"
                + (f" RSS {last.rss_mb:.0f} MB fds {last.fds} threads {last.threads}" if last else ""),
                flush=True,
            )
            if last:  # so far, in case the run is cut short
                so_far = report(args, mix, tally, sampler.samples, time.monotonic() - started, last, None)
                args.json.write_text(json.dumps(so_far | {"partial": True}, indent=1))

    reporting = asyncio.create_task(progress())
    await asyncio.gather(*(worker(kind, n) for kind, count in mix.items() for n in range(count)))
    traffic_s = time.monotonic() - started
    reporting.cancel()
    other_cpu_cores = others.stop()
    await asyncio.sleep(args.settle_s)
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    import aiohttp

    async with aiohttp.ClientSession() as http:
        settled = await sampler.sample(started, http)
    return report(args, mix, tally, sampler.samples, traffic_s, settled, other_cpu_cores)


def report(
    args: argparse.Namespace,
    mix: dict[str, int],
    tally: Tally,
    samples: list[Sample],
    traffic_s: float,
    settled: Sample,
    other_cpu_cores: float | None,
) -> dict[str, Any]:
    warmup_s = args.warmup_min * 60
    steady = [s for s in samples if warmup_s <= s.t <= traffic_s]
    during = [s for s in samples if s.t <= traffic_s]

    def slope(name: str) -> float | None:
        return slope_per_min([(s.t, float(getattr(s, name))) for s in steady])

    def at(sample: Sample | None) -> dict[str, Any] | None:
        return asdict(sample) if sample else None

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {
        "command": " ".join(sys.argv),
        "commit": commit.stdout.strip(),
        "duration_min": args.duration_min,
        "warmup_min": args.warmup_min,
        "traffic_s": traffic_s,
        "mix": mix,
        "done": dict(tally.done),
        "errors": {kind: dict(counter) for kind, counter in tally.errors.items()},
        "error_count": {kind: sum(counter.values()) for kind, counter in tally.errors.items()},
        "latency_s": {
            kind: {"p50": percentile(v, 50), "p95": percentile(v, 95), "max": max(v)}
            for kind, v in tally.seconds.items()
        },
        "slope_per_min": {
            name: slope(name)
            for name in (
                "rss_mb",
                "rss_anon_mb",
                "tts_cache_mb",
                "fds",
                "threads",
                "child_rss_mb",
                "child_fds",
                "child_threads",
            )
        },
        "steady_samples": len(steady),
        "first": at(samples[0] if samples else None),
        "at_warmup": at(steady[0] if steady else None),
        "end_of_traffic": at(during[-1] if during else None),
        "settled": at(settled),
        "peak_rss_mb": max((s.rss_mb for s in samples), default=None),
        "other_cpu_cores": other_cpu_cores,
        "samples": [asdict(s) for s in samples],
    }


def plot(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, (rss, fds, threads, sessions) = plt.subplots(4, 1, figsize=(10, 11), sharex=True, height_ratios=(3, 2, 2, 1))
    rss.plot(t, [s["rss_mb"] for s in samples], label="server RSS")
    rss.plot(t, [s["rss_anon_mb"] for s in samples], label="server RssAnon")
    rss.plot(t, [s["child_rss_mb"] for s in samples], label="children (llama-server) RSS")
    rss.plot(t, [s["tts_cache_mb"] for s in samples], label="TTS response cache")
    slope = result["slope_per_min"]["rss_mb"]
    steady = [s for s in samples if result["warmup_min"] * 60 <= s["t"] <= result["traffic_s"]]
    if slope is not None and len(steady) >= 3:
        x = np.array([s["t"] for s in steady]) / 60
        fit = np.polyfit(x, [s["rss_mb"] for s in steady], 1)
        rss.plot(x, np.polyval(fit, x), "k--", label=f"fit after warm-up: {slope:+.2f} MB/min")
    rss.set_ylabel("MB")
    rss.legend(loc="upper left", fontsize=8)
    fds.plot(t, [s["fds"] for s in samples], label="server")
    fds.plot(t, [s["child_fds"] for s in samples], label="children")
    fds.set_ylabel("open fds")
    fds.legend(loc="upper left", fontsize=8)
    threads.plot(t, [s["threads"] for s in samples], label="server")
    threads.plot(t, [s["child_threads"] for s in samples], label="children")
    threads.set_ylabel("threads")
    threads.legend(loc="upper left", fontsize=8)
    sessions.plot(t, [s["sessions"] for s in samples], color="tab:red")
    sessions.set_ylabel("sessions open")
    sessions.set_xlabel("minutes")
    for axis in (rss, fds, threads, sessions):
        axis.axvline(result["warmup_min"], color="gray", linestyle=":")
        axis.axvline(result["traffic_s"] / 60, color="gray", linestyle=":")
    errors = sum(result["error_count"].values())
    fig.suptitle(
        f"mixed soak {result['duration_min']:g} min ({result['commit']}): {sum(result['done'].values())} operations, "
        f"{errors} errors"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_report(result: dict[str, Any]) -> None:
    print(f"mixed soak, {result['traffic_s'] / 60:.1f} min of traffic, warm-up {result['warmup_min']:g} min")
    for kind in KINDS:
        if not result["mix"].get(kind):
            continue
        lat = result["latency_s"].get(kind)
        timing = f", p50 {lat['p50']:.2f} s, p95 {lat['p95']:.2f} s, max {lat['max']:.2f} s" if lat else ""
        print(
            f"  {kind:<13} workers {result['mix'][kind]}, done {result['done'].get(kind, 0)}, "
            f"errors {result['error_count'].get(kind, 0)}{timing}"
        )
        for label, count in sorted(result["errors"].get(kind, {}).items(), key=lambda kv: -kv[1])[:5]:
            print(f"      {count} x {label}")
    slope = result["slope_per_min"]

    def fmt(value: float | None, unit: str) -> str:
        return "n/a (too few samples after the warm-up)" if value is None else f"{value:+.3f} {unit}/min"

    print(
        f"slope after warm-up ({result['steady_samples']} samples): server RSS {fmt(slope['rss_mb'], 'MB')}, "
        f"RssAnon {fmt(slope['rss_anon_mb'], 'MB')}, children RSS {fmt(slope['child_rss_mb'], 'MB')}, "
        f"TTS cache {fmt(slope['tts_cache_mb'], 'MB')}"
    )
    print(
        f"  fds {fmt(slope['fds'], '')}, threads {fmt(slope['threads'], '')}; "
        f"children fds {fmt(slope['child_fds'], '')}, threads {fmt(slope['child_threads'], '')}"
    )
    for label in ("first", "at_warmup", "end_of_traffic", "settled"):
        s = result[label]
        if s:
            print(
                f"  {label:<15} t {s['t'] / 60:5.1f} min: RSS {s['rss_mb']:.0f} MB (anon {s['rss_anon_mb']:.0f}), "
                f"fds {s['fds']}, threads {s['threads']}, sessions {s['sessions']:.0f}, "
                f"TTS cache {s['tts_cache_mb']:.1f} MB; children {s['children']}: "
                f"RSS {s['child_rss_mb']:.0f} MB, fds {s['child_fds']}, threads {s['child_threads']}"
            )
    if result["other_cpu_cores"] is not None:
        print(f"other processes (neither the server nor this client) kept {result['other_cpu_cores']:.2f} cores busy")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="soak.py --mixed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration-min", type=float, default=30.0, help="minutes of traffic")
    parser.add_argument("--warmup-min", type=float, default=5.0, help="samples before this are left out of slopes")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--settle-s", type=float, default=15.0, help="after the traffic, wait this long, sample")
    parser.add_argument("--mix", default=DEFAULT_MIX, help=f"workers per kind (default {DEFAULT_MIX})")
    parser.add_argument(
        "--pause-s", type=float, nargs=2, default=(1.0, 3.0), metavar=("MIN", "MAX"), help="between a worker's ops"
    )
    parser.add_argument("--op-timeout-s", type=float, default=180.0, help="one operation at most this long")
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--server-pid", type=int, help="its pid, for RSS, fds and threads")
    parser.add_argument("--wyoming-port", type=int, help="its Wyoming port (loopback)")
    parser.add_argument("--json", type=Path, default=REPO / "bench-results" / "soak-mixed.json")
    parser.add_argument("--plot", type=Path, default=REPO / "bench-results" / "soak-mixed.png")
    args = parser.parse_args(argv)
    parse_mix(args.mix)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    if args.url:
        result = asyncio.run(soak(args, args.url.rstrip("/"), args.server_pid, args.wyoming_port))
    else:
        port = free_port()
        env = {"MEDIASERVER_WYOMING_HOST": "127.0.0.1", "MEDIASERVER_WYOMING_PORT": str(port)}
        log = args.json.with_suffix(".server.log")
        with child_server(log, 240, env, log_level="INFO") as (url, process):
            result = asyncio.run(soak(args, url, process.pid, port))
    args.json.write_text(json.dumps(result, indent=1))
    plot(args.plot, result)
    print_report(result)
    print(f"wrote {args.json} and {args.plot}")
    return 1 if result["error_count"] else 0

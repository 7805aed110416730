#!/usr/bin/env python3
"""Time to first token and tokens/s: mediaserver's llama-server engine vs llama.cpp in-process, 1 and 4 streams.

In one run, on the same prompts, with the same GGUF, thread count and greedy decoding:
  1. direct: llama-cpp-python's ``Llama.create_chat_completion(stream=True)`` in this process,
     the way an application embeds llama.cpp itself: one context, one generation at a time;
  2. server: ``POST /v1/chat/completions`` with ``stream=true`` to a mediaserver child process
     (``python -m mediaserver``, default settings: its llama-server engine with ``llm_slots`` = 4
     slots, continuously batched), SSE read by aiohttp as it arrives.

Both sides run alone (one request at a time, alternating direct and server so that load from
other processes hits both alike) and with 4 concurrent clients (4 requests at once; the direct
side's one context runs them back to back from the same start, the server's engine batches them).
Every request asks for exactly ``--tokens`` tokens of a story that does not end sooner, so
tokens/s compares equal work; each prompt is different so the prompt is really evaluated (llama.cpp
reuses a cached prefix) and the system prompt part is the same everywhere. The server applies the
bundled model's repetition controls (repeat penalty 1.1 and DRY); the direct side gets the same
repeat penalty (llama-cpp-python has no DRY), so the texts may differ.

Time to first token is measured from sending the request (or calling the library) to the first
non-empty text; a stream's tokens/s is (tokens - 1) / (time of its last token - time of its first).
With 4 clients: TTFT is the median over the clients (waiting for earlier ones counts), per-stream
tokens/s the median over the streams, and total tokens/s all tokens of the 4 over the wall time
from their start to the last token.

Targets: with 4 streams, the server's total tokens/s ≥ 2.5 × one stream's, and its TTFT p50 ≤
1.5 × one stream's; alone, the server's TTFT ≤ 1.10 × direct and tokens/s ≥ 0.95 × direct. Writes
``bench-results/bench-llm.png`` and ``.json``.

Then, through the server only, ``--turns`` (6) turns of a conversation that resends its history
(as chat clients and the voice loop do), alone and 4 at once: TTFT by turn, which the per-slot
prompt cache keeps from growing with the conversation.

Usage: python tools/bench_llm.py [--url http://127.0.0.1:19001] [--rounds 5] [--tokens 64] [--turns 6]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, child_server, get_json

sys.path.insert(0, str(REPO))

TARGET_TTFT_RATIO = 1.10
TARGET_TPS_RATIO = 0.95
TARGET_SCALE_TPS = 2.5  # server: 4 streams' total tokens/s over one stream's
TARGET_SCALE_TTFT = 1.5  # server: TTFT p50 with 4 streams over one stream's
REPEAT_PENALTY = 1.1  # the bundled model's default on the server (mediaserver/llm/defaults.py)
CONCURRENCY = 4
SYSTEM = "You are a storyteller. You always write long, detailed stories."
TOPICS = (
    "a cat who travels the world",
    "a lighthouse keeper and a storm",
    "a robot learning to cook",
    "two friends lost in a forest",
    "a dragon who is afraid of fire",
    "a city under the sea",
    "a clockmaker's last invention",
    "a train that never stops",
    "a garden that grows at night",
    "a letter delivered fifty years late",
)


@dataclass
class Run:
    side: str  # "direct" or "server"
    mode: str  # "alone" or "concurrent"
    ttft_s: float
    tokens: int
    first_s: float  # from this request's start to its first token (== ttft_s)
    last_s: float  # from this request's start to its last token
    start_s: float  # start, relative to the batch's start (concurrent runs)


def messages(index: int) -> list[dict[str, str]]:
    topic = TOPICS[index % len(TOPICS)]
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Story number {index}: tell me a long story about {topic}."},
    ]


# ----------------------------------------------------------------------------- direct


class Direct:
    """llama.cpp in this process, loaded as the server loads it (same GGUF, threads, context)."""

    def __init__(self) -> None:
        from llama_cpp import Llama
        from llama_inprocess import llama_kwargs

        from mediaserver.config import Settings
        from mediaserver.llm.registry import LlmRegistry

        settings = Settings()
        registry = LlmRegistry(settings)
        source = registry.source(registry.default_name or "")
        self.kwargs = llama_kwargs(settings)
        self.llama: Any = Llama(model_path=source.location, **self.kwargs)

    def run(self, index: int, tokens: int, started: float) -> tuple[Run, str]:
        begin = time.perf_counter()
        first = last = None
        count = 0
        text: list[str] = []
        stream = self.llama.create_chat_completion(
            messages=messages(index), max_tokens=tokens, temperature=0.0, repeat_penalty=REPEAT_PENALTY, stream=True
        )
        finish = None
        for chunk in stream:
            choice = chunk["choices"][0]
            content = choice["delta"].get("content")
            finish = choice.get("finish_reason") or finish
            if content:
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                count += 1
                text.append(content)
        assert first is not None and last is not None, "no tokens"
        # A chunk can hold more than one token (a character split across tokens); a "length" finish
        # means exactly max_tokens were generated.
        count = tokens if finish == "length" else count
        return Run("direct", "", first - begin, count, first - begin, last - begin, begin - started), "".join(text)


# ----------------------------------------------------------------------------- server


async def server_run(url: str, index: int, tokens: int, started: float) -> tuple[Run, str, int]:
    import aiohttp

    body = {"model": "gpt-4o-mini", "messages": messages(index), "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        begin = time.perf_counter()
        first = last = None
        count = 0
        usage = 0
        text: list[str] = []
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                raise SystemExit(f"server answered {resp.status}: {await resp.text()}")
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = int(chunk["usage"]["completion_tokens"])
                for choice in chunk["choices"]:
                    content = choice["delta"].get("content")
                    if content:
                        now = time.perf_counter()
                        first = first if first is not None else now
                        last = now
                        count += 1
                        text.append(content)
    assert first is not None and last is not None, "no tokens"
    run = Run("server", "", first - begin, usage or count, first - begin, last - begin, begin - started)
    return run, "".join(text), usage


# ----------------------------------------------------------------------------- measuring


def tokens_per_s(run: Run) -> float:
    return (run.tokens - 1) / (run.last_s - run.first_s) if run.last_s > run.first_s else 0.0


def summary(runs: list[Run], concurrent: bool) -> dict[str, float]:
    ttft = statistics.median(r.ttft_s for r in runs)
    per_stream = statistics.median(tokens_per_s(r) for r in runs)
    if concurrent:
        # Aggregate over each batch of CONCURRENCY requests: all tokens over the batch's wall time.
        rates = []
        for start in range(0, len(runs), CONCURRENCY):
            batch = runs[start : start + CONCURRENCY]
            wall = max(r.start_s + r.last_s for r in batch) - min(r.start_s for r in batch)
            rates.append(sum(r.tokens for r in batch) / wall)
        total = statistics.median(rates)
    else:
        total = per_stream
    return {
        "ttft_s": ttft,
        "ttft_p95_s": sorted(r.ttft_s for r in runs)[max(0, round(0.95 * len(runs)) - 1)],
        "tokens_per_s": total,
        "stream_tokens_per_s": per_stream,
        "tokens": statistics.mean(r.tokens for r in runs),
    }


async def measure(url: str, direct: Direct, rounds: int, tokens: int) -> dict[str, Any]:
    results: dict[str, list[Run]] = {"direct-alone": [], "server-alone": [], "direct-concurrent": [],
                                     "server-concurrent": []}  # fmt: skip
    mismatches = 0
    usage_mismatch = 0
    index = 100
    # Warm up both (first call pays page faults and thread start-up). The server's slots are warmed
    # all at once (CONCURRENCY requests, one per slot), as the in-process side's one context is by
    # its one call: each then holds the shared system prompt, and "alone" compares warm with warm
    # (one warmed slot left the next alone requests on cold slots: 300 ms TTFT instead of ~120).
    await asyncio.to_thread(direct.run, 0, 4, time.perf_counter())
    await asyncio.gather(*(server_run(url, 1 + i, 4, time.perf_counter()) for i in range(CONCURRENCY)))
    for round_ in range(rounds):
        order = ("direct", "server") if round_ % 2 == 0 else ("server", "direct")
        index += 1
        texts = {}
        for side in order:
            if side == "direct":
                run, text = await asyncio.to_thread(direct.run, index, tokens, time.perf_counter())
            else:
                run, text, usage = await server_run(url, index, tokens, time.perf_counter())
                usage_mismatch += usage != tokens
            run.mode = "alone"
            results[f"{side}-alone"].append(run)
            texts[side] = text
        mismatches += texts["direct"] != texts["server"]
        print(f"  alone round {round_ + 1}/{rounds}: direct ttft {results['direct-alone'][-1].ttft_s * 1000:.0f} ms, "
              f"server ttft {results['server-alone'][-1].ttft_s * 1000:.0f} ms", flush=True)  # fmt: skip
    for round_ in range(rounds):
        order = ("direct", "server") if round_ % 2 == 0 else ("server", "direct")
        indices = list(range(index + 1, index + 1 + CONCURRENCY))
        index += CONCURRENCY
        for side in order:
            started = time.perf_counter()
            if side == "direct":  # one context: the 4 requests, back to back, all from ``started``
                batch = []
                for i in indices:
                    run, _ = await asyncio.to_thread(direct.run, i, tokens, started)
                    run.ttft_s = run.start_s + run.first_s  # waiting for the earlier ones counts
                    batch.append(run)
            else:
                outcomes = await asyncio.gather(*(server_run(url, i, tokens, started) for i in indices))
                batch = []
                for run, _, _ in outcomes:
                    run.ttft_s = run.start_s + run.first_s
                    batch.append(run)
            for run in batch:
                run.mode = "concurrent"
            results[f"{side}-concurrent"].extend(batch)
        print(f"  concurrent round {round_ + 1}/{rounds} done", flush=True)
    return {"runs": results, "text_mismatches": mismatches, "usage_mismatches": usage_mismatch}


CONVERSATION = (
    "Hi, I am planning a trip to the sea.",
    "What should I pack?",
    "And what about food?",
    "Which month is best?",
    "How do I get there by train?",
    "Thanks. Any last advice?",
)


async def measure_conversations(url: str, turns: int) -> dict[str, list[float]]:
    """TTFT of each turn of growing conversations (system prompt + history resent every turn, as
    a chat client does): one conversation alone, then CONCURRENCY at once, turn by turn. With the
    prompt cache of its own slot, a turn evaluates only its new message: TTFT should not grow."""
    import aiohttp

    async def turn(session: aiohttp.ClientSession, history: list[dict[str, str]]) -> float:
        body = {"model": "gpt-4o-mini", "messages": history, "max_tokens": 40, "temperature": 0, "stream": True}
        begin = time.perf_counter()
        first: float | None = None
        text: list[str] = []
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        if choice["delta"].get("content"):
                            first = first or time.perf_counter()
                            text.append(choice["delta"]["content"])
        history.append({"role": "assistant", "content": "".join(text)})
        assert first is not None, "no tokens"
        return first - begin

    results: dict[str, list[float]] = {}
    async with aiohttp.ClientSession() as session:
        for count in (1, CONCURRENCY):
            histories = [[{"role": "system", "content": SYSTEM}] for _ in range(count)]
            medians = []
            for question in CONVERSATION[:turns]:
                for n, history in enumerate(histories):
                    history.append({"role": "user", "content": f"{question} (traveller {n})"})
                medians.append(statistics.median(await asyncio.gather(*(turn(session, h) for h in histories))))
            results[f"{count} conversation(s)"] = medians
            print(
                f"  conversations x{count}: TTFT by turn " + ", ".join(f"{t * 1000:.0f}" for t in medians), flush=True
            )
    return results


def plot(figures: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    modes = ("1 stream", f"{CONCURRENCY} streams")
    keys = ("alone", "concurrent")
    width = 0.35
    panels = (
        ("ttft_s", 1000, "time to first token, p50 (ms, lower is better)"),
        ("stream_tokens_per_s", 1, "tokens/s per stream (higher is better)"),
        ("tokens_per_s", 1, "tokens/s, all streams (higher is better)"),
    )
    for ax, (field, scale, title) in zip(axes, panels, strict=True):
        for offset, side, color in ((-width / 2, "direct", "#888888"), (width / 2, "server", "#2a7ab9")):
            values = [figures[f"{side}-{k}"][field] * scale for k in keys]
            label = "llama.cpp in-process (1 context)" if side == "direct" else "mediaserver → llama-server (4 slots)"
            bars = ax.bar([i + offset for i in range(2)], values, width, label=label, color=color)
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(2), modes)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start one as a child process)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per answer (exactly: the story goes on)")
    parser.add_argument("--plot", type=Path, default=REPO / "bench-results" / "bench-llm.png")
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    parser.add_argument("--turns", type=int, default=6, help="turns of the conversation phase (0: skip it)")
    args = parser.parse_args()

    direct = Direct()
    print(f"llama.cpp in-process: {direct.kwargs}", flush=True)
    with contextlib.ExitStack() as stack:
        log_path = args.plot.with_suffix(".server.log")
        url = args.url or stack.enter_context(child_server(log_path, args.startup_timeout_s))[0]
        health = get_json(f"{url}/health") or {}
        print(f"server {url}: llm {health.get('features', {}).get('llm')}", flush=True)
        raw = asyncio.run(measure(url, direct, args.rounds, args.tokens))
        conversations = asyncio.run(measure_conversations(url, args.turns)) if args.turns else {}

    figures = {key: summary(runs, key.endswith("concurrent")) for key, runs in raw["runs"].items()}
    print(f"\n{args.rounds} rounds, {args.tokens} tokens per answer, {os.cpu_count()} cores, {platform.processor()}")
    print(f"{'':22}{'TTFT p50 ms':>12}{'p95 ms':>8}{'tok/s/stream':>14}{'tok/s total':>13}")
    for key, fig in figures.items():
        print(
            f"{key:22}{fig['ttft_s'] * 1000:12.1f}{fig['ttft_p95_s'] * 1000:8.1f}"
            f"{fig['stream_tokens_per_s']:14.1f}{fig['tokens_per_s']:13.1f}"
        )
    verdicts = []
    alone, four = figures["server-alone"], figures["server-concurrent"]
    scale_tps = four["tokens_per_s"] / alone["tokens_per_s"]
    scale_ttft = four["ttft_s"] / alone["ttft_s"]
    verdicts += [scale_tps >= TARGET_SCALE_TPS, scale_ttft <= TARGET_SCALE_TTFT]
    print(
        f"server, {CONCURRENCY} streams vs 1: total tokens/s {scale_tps:.2f}× (target ≥ {TARGET_SCALE_TPS}: "
        f"{'met' if scale_tps >= TARGET_SCALE_TPS else 'NOT met'}), TTFT p50 {scale_ttft:.2f}× "
        f"(target ≤ {TARGET_SCALE_TTFT}: {'met' if scale_ttft <= TARGET_SCALE_TTFT else 'NOT met'})"
    )
    ratios: dict[str, dict[str, float]] = {}
    ratios["server_4_vs_1"] = {"tokens_per_s": scale_tps, "ttft": scale_ttft}
    for mode in ("alone", "concurrent"):
        d, s = figures[f"direct-{mode}"], figures[f"server-{mode}"]
        ttft_ratio = s["ttft_s"] / d["ttft_s"]
        tps_ratio = s["tokens_per_s"] / d["tokens_per_s"]
        ratios[mode] = {"ttft": ttft_ratio, "tokens_per_s": tps_ratio}
        ok_ttft = ttft_ratio <= TARGET_TTFT_RATIO
        ok_tps = tps_ratio >= TARGET_TPS_RATIO
        if mode == "alone":  # with 4 streams the in-process side is the baseline, not a target
            verdicts += [ok_ttft, ok_tps]
        if mode == "alone":
            print(
                f"{mode:10} server/direct: TTFT {ttft_ratio:.3f}× (target ≤ {TARGET_TTFT_RATIO}: "
                f"{'met' if ok_ttft else 'NOT met'}), tokens/s {tps_ratio:.3f}× (target ≥ {TARGET_TPS_RATIO}: "
                f"{'met' if ok_tps else 'NOT met'})"
            )
        else:
            print(f"{mode:10} server/direct: TTFT {ttft_ratio:.3f}×, total tokens/s {tps_ratio:.3f}×")
    print(f"answers that differ between direct and server (greedy, same prompt): {raw['text_mismatches']}")
    print(f"server usage.completion_tokens != {args.tokens}: {raw['usage_mismatches']}")
    for key, ttfts in conversations.items():
        print(f"conversation TTFT by turn, {key}: " + ", ".join(f"{t * 1000:.0f}" for t in ttfts) + " ms")
    plot(figures, args.plot)
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "figures": figures,
        "ratios": ratios,
        "text_mismatches": raw["text_mismatches"],
        "runs": {k: [asdict(r) for r in v] for k, v in raw["runs"].items()},
        "conversation_ttft_s": conversations,
    }
    args.plot.with_suffix(".json").write_text(json.dumps(result, indent=2))
    print(f"wrote {args.plot} and {args.plot.with_suffix('.json')}")
    if not all(verdicts):
        print("some targets were not met (see above)")


if __name__ == "__main__":
    main()

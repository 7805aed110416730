#!/usr/bin/env python3
"""A long conversation's first token, past the history's limit: the oldest turns dropped one at a
time, or a few at a time (``assistant_history_drop_turns``).

The voice loop sends at most ``assistant_history_turns`` (8) earlier turns. Dropped one at a time,
every turn past the limit starts its history one turn later than the turn before, so llama-server
re-reads or shifts (``--cache-reuse``) the whole history before the first token; dropped a few at a
time, the turns after a drop keep the same start and the engine's prompt cache holds it.

This bench runs the server's own ``LlmService`` on the bundled SmolLM2 engine and the voice loop's
own prompt builder (``assistant/prompt.py``) and holds, side by side, one conversation per
``--drop`` value (each with its own system prompt, so each keeps its own slot), turn by turn in
alternation: the same questions as ``bench_voice_loop.py``, answers at temperature 0 kept in each
history. Printed: each turn's time to the first token and the prompt tokens taken from the cache;
then, over the turns past the limit, the median and p95 side by side. ``--plot`` draws them.

    python tools/bench_history_drop.py [--turns 24] [--drop 1,4] [--plot docs/history-drop.png]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_voice_loop import MAX_ANSWER_TOKENS, QUESTIONS, SYSTEM_PROMPT
from benchlib import REPO, median, percentile

sys.path.insert(0, str(REPO))

from mediaserver.assistant.prompt import build_prompt
from mediaserver.assistant.turn_types import AssistantOptions
from mediaserver.config import Settings
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.metrics import Metrics


async def turn(llm: LlmService, messages: list[ChatMessage]) -> tuple[float, int, str]:
    """Seconds to the first token, the prompt tokens the engine took from its cache, the answer."""
    began = time.perf_counter()
    first = float("nan")
    params = GenerationParams(max_tokens=MAX_ANSWER_TOKENS, temperature=0.0)
    async with llm.stream(messages, params) as answer:
        async for _ in answer:
            first = time.perf_counter() - began
            break
        text = await answer.text()
    usage = answer.usage
    return first, (usage.cached_tokens or 0) if usage is not None else 0, text


async def run(turns: int, drops: list[int]) -> tuple[dict[int, list[float]], int]:
    settings = Settings()
    llm = LlmService(settings, Metrics())
    await llm.start()
    base = AssistantOptions.from_settings(settings)
    histories: dict[int, list[ChatMessage]] = {drop: [] for drop in drops}
    firsts: dict[int, list[float]] = {drop: [] for drop in drops}
    try:
        await turn(llm, [ChatMessage("system", "Warm up."), ChatMessage("user", "Hi.")])
        for n in range(turns):
            question = ChatMessage("user", QUESTIONS[n % len(QUESTIONS)])
            for drop in drops:
                options = AssistantOptions(
                    system_prompt=f"{SYSTEM_PROMPT} (conversation {drop})",
                    history_turns=base.history_turns,
                    history_tokens=base.history_tokens,
                    history_drop_turns=drop,
                )
                history = histories[drop]
                prompt = build_prompt([*history, question], options, settings, None, None)
                seconds, cached, answer = await turn(llm, prompt)
                firsts[drop].append(seconds)
                history += [question, ChatMessage("assistant", answer.strip())]
                kept = sum(m.role == "user" for m in prompt) - 1
                print(
                    f"turn {n + 1:2d} drop {drop}: {kept} earlier turns sent, first token {seconds:.3f} s, "
                    f"{cached} of the prompt's tokens from the cache",
                    flush=True,
                )
    finally:
        await llm.aclose()
    return firsts, base.history_turns


def plot(firsts: dict[int, list[float]], limit: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    for drop, seconds in firsts.items():
        ax.plot(range(1, len(seconds) + 1), seconds, marker="o", label=f"assistant_history_drop_turns {drop}")
    ax.axvline(limit + 0.5, color="grey", linestyle=":", label=f"past assistant_history_turns ({limit})")
    ax.set_xlabel("turn")
    ax.set_ylabel("first token, s")
    ax.set_title("tools/bench_history_drop.py (SmolLM2-135M, llama-server, 1 thread)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--drop", default="1,4", type=lambda v: [int(x) for x in v.split(",")])
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    firsts, limit = asyncio.run(run(args.turns, args.drop))
    print(f"first token over turns {limit + 2}-{args.turns} (past the limit), median / p95:")
    for drop, seconds in firsts.items():
        past = seconds[limit + 1 :]
        print(f"  drop {drop}: {median(past):.3f} / {percentile(past, 95):.3f} s")
    if args.plot is not None:
        plot(firsts, limit, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A new conversation's first token, with and without its system prompt prefilled.

The voice loop evaluates a session's system prompt (and tools) when the session starts, into the
llama-server slot its first turn will take (``LlmService.prefill``), so the first answer evaluates
only the question. This bench runs the server's own ``LlmService`` on the bundled SmolLM2 engine
and alternates, for ``--conversations`` new system prompts (each one new to the engine, as a
session's own ``system_prompt`` or a speaker-named prompt is): the first turn on a cold slot, and
the first turn after ``prefill``. Printed: the time to the first token and the prompt tokens taken
from the cache, each, and the medians side by side; ``--plot`` draws both.

    python tools/bench_prefill.py [--conversations 10] [--plot docs/prefill.png]

``--partials``: a question prefilled while it is spoken (``turn_prefill_partials``). Two voice-loop
conversations side by side (the system prompt, then ``--turns`` of the bench_voice_loop questions,
each answer kept in the history as the loop keeps it), turn by turn in alternation; in one the odd
turns are prefilled, in the other the even ones. A prefilled turn first prefills the question as its
last partial reads it (its words but the last, no mark: "What do bees"), then asks the whole
question after 0.3 s (the last word and the pause). Printed as above: first token, cold against
prefilled, on the same conversations and turns.

    python tools/bench_prefill.py --partials [--turns 12] [--plot docs/prefill-partials.png]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, median

sys.path.insert(0, str(REPO))

from mediaserver.config import Settings
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.metrics import Metrics

SYSTEM = "{} is your name. You are a helpful voice assistant. Answer in one or two short sentences, kindly and clearly."
NAMES = ["Juniper", "Marigold", "Aster", "Willow", "Hazel", "Rowan", "Sorrel", "Linden", "Briar", "Clover"]
QUESTION = ChatMessage("user", "What do bees make?")
QUESTIONS = (
    "What color is the sky?",
    "What do bees make?",
    "How many legs does a spider have?",
    "What is a good breakfast?",
)
VOICE_SYSTEM = "You are a helpful voice assistant. Answer in one or two short sentences."


async def first_token(llm: LlmService, messages: list[ChatMessage]) -> tuple[float, int]:
    """Seconds to the first token, and the prompt tokens the engine took from its cache."""
    began = time.perf_counter()
    first = float("nan")
    async with llm.stream(messages, GenerationParams(max_tokens=8, temperature=0.0)) as answer:
        async for _ in answer:
            first = time.perf_counter() - began
            break
        await answer.text()
    usage = answer.usage
    return first, usage.cached_tokens or 0 if usage is not None else 0


async def run(conversations: int) -> dict[str, list[float]]:
    llm = LlmService(Settings(), Metrics())
    await llm.start()
    times: dict[str, list[float]] = {"cold": [], "prefilled": []}
    try:
        await first_token(llm, [ChatMessage("system", "Warm up."), ChatMessage("user", "Hi.")])
        for n in range(conversations):
            name = f"{NAMES[n % len(NAMES)]}{n // len(NAMES) or ''}"
            system = ChatMessage("system", SYSTEM.format(name))
            kind = "prefilled" if n % 2 else "cold"
            if kind == "prefilled":
                evaluated = await llm.prefill([system])
            await asyncio.sleep(0.3)  # a person starting to speak
            seconds, cached = await first_token(llm, [system, QUESTION])
            times[kind].append(seconds)
            extra = f" (prefill evaluated {evaluated})" if kind == "prefilled" else ""
            print(f"{name:10s} {kind:9s} first token {seconds:.3f} s, {cached} prompt tokens from the cache{extra}")
    finally:
        await llm.aclose()
    return times


async def answer(llm: LlmService, messages: list[ChatMessage]) -> tuple[float, str, str]:
    """One turn: seconds to the first token, prompt tokens "from the cache/of the prompt", the answer."""
    began = time.perf_counter()
    first = float("nan")
    parts: list[str] = []
    async with llm.stream(messages, GenerationParams(max_tokens=60, temperature=0.0)) as stream:
        async for delta in stream:
            if not parts:
                first = time.perf_counter() - began
            parts.append(delta)
    usage = stream.usage
    tokens = f"{usage.cached_tokens or 0}/{usage.prompt_tokens}" if usage is not None else "?"
    return first, tokens, "".join(parts).strip()


async def run_partials(turns: int) -> dict[str, list[float]]:
    """Two conversations, turn by turn in alternation; each prefills every other turn's question."""
    llm = LlmService(Settings(), Metrics())
    await llm.start()
    times: dict[str, list[float]] = {"cold": [], "prefilled": []}
    # Two conversations of two sessions (named differently: llama-server slots know a conversation by its start)
    histories = [[ChatMessage("system", f"{name} is your name. {VOICE_SYSTEM}")] for name in NAMES[:2]]
    try:
        await first_token(llm, [ChatMessage("system", "Warm up."), ChatMessage("user", "Hi.")])
        for history in histories:  # each session's system prompt, as the voice loop prefills it
            await llm.prefill(history)
        for turn in range(turns):
            question = QUESTIONS[turn % len(QUESTIONS)]
            for side in (0, 1) if turn % 4 < 2 else (1, 0):  # each goes first in half the turns
                history = histories[side]
                kind = "prefilled" if (turn + side) % 2 else "cold"
                evaluated = 0
                if kind == "prefilled":
                    partial = " ".join(question.rstrip("?.!").split()[:-1])
                    evaluated = await llm.prefill([*history, ChatMessage("user", partial)])
                await asyncio.sleep(0.3)  # the last word and the pause
                history.append(ChatMessage("user", question))
                seconds, cached, text = await answer(llm, history)
                history.append(ChatMessage("assistant", text))
                times[kind].append(seconds)
                extra = f" (prefill evaluated {evaluated})" if kind == "prefilled" else ""
                print(
                    f"turn {turn + 1:2d} conversation {'ab'[side]} {kind:9s} first token {seconds:.3f} s, "
                    f"{cached} prompt tokens from the cache{extra}"
                )
    finally:
        await llm.aclose()
    return times


def plot(times: dict[str, list[float]], path: Path, labels: tuple[str, str], what: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.boxplot(
        [times["cold"], times["prefilled"]],
        tick_labels=list(labels),
        orientation="horizontal",
    )
    ax.set_xlabel(f"{what}'s first token, s (SmolLM2-135M, llama-server, 1 thread)")
    ax.set_title("tools/bench_prefill.py")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=10)
    parser.add_argument("--partials", action="store_true", help="questions prefilled while spoken")
    parser.add_argument("--turns", type=int, default=12, help="--partials: turns of each conversation")
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    if args.partials:
        times = asyncio.run(run_partials(args.turns))
        labels, what = ("question not prefilled", "prefilled from its partial"), "a turn"
    else:
        times = asyncio.run(run(args.conversations))
        labels, what = ("cold slot", "system prompt prefilled"), "a new conversation"
    cold, warm = median(times["cold"]), median(times["prefilled"])
    print(f"first token, median: {labels[0]} {cold:.3f} s, {labels[1]} {warm:.3f} s ({cold / warm:.1f}x sooner)")
    if args.plot is not None:
        plot(times, args.plot, labels, what)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()

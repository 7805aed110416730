"""The bundled model answers plain questions sensibly with its defaults (no system prompt, no sampling
parameters: what ``curl /v1/chat/completions`` sends).

Before per-model defaults, "What is the capital of France?" got 1024 tokens of looping French. Each
question has a fixed seed (the only parameter sent), so the answers repeat on this CPU. Measured with
the defaults (temperature 0.2, top_p 0.9, repeat penalty 1.1, DRY 0.8): these seeds 9/10 and no answer
at the cap; three other seed sets 6, 9 and 7/10, two of them with one answer ("What do bees make?",
an essay, not a loop) stopped by the 256-token default cap; unseeded runs 6 to 8/10. At the old 0.7
without repetition control: 5 to 7/10 and up to 3 answers at the cap.
"""

from __future__ import annotations

import asyncio
import re

from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams

# (question, words any of which makes the answer right)
QUESTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("How many days are in a week?", ("seven", "7")),
    ("What is the capital of France?", ("paris",)),
    ("What color is the sky on a clear day?", ("blue",)),
    ("How many legs does a spider have?", ("eight", "8")),
    ("What is the opposite of hot?", ("cold",)),
    ("What do bees make?", ("honey",)),
    ("How many hours are in a day?", ("24", "twenty-four", "twenty four")),
    ("What is the largest planet in our solar system?", ("jupiter",)),
    ("What animal says moo?", ("cow",)),
    ("What is frozen water called?", ("ice",)),
]
MIN_RIGHT = 7  # of 10, most; measured 9 with these seeds (see the module docstring)


async def test_plain_questions_get_short_sensible_answers(llm_service: LlmService) -> None:
    async def ask(question: str) -> tuple[str, str | None]:
        answer = await llm_service.complete([ChatMessage("user", question)], GenerationParams(seed=len(question)))
        return answer.text, answer.finish_reason

    answers = await asyncio.gather(*(ask(question) for question, _ in QUESTIONS))
    right = 0
    for (question, words), (text, finish) in zip(QUESTIONS, answers, strict=True):
        found = any(re.search(rf"\b{re.escape(word)}\b", text.lower()) for word in words)
        right += found
        print(f"{'ok ' if found else 'NO '} {question!r} -> {text.strip()[:120]!r} ({finish})")
    print(f"score: {right}/{len(QUESTIONS)}")
    # None ran into the token cap (llm_default_max_tokens): no runaway answers.
    assert all(finish == "stop" for _, finish in answers), [finish for _, finish in answers]
    assert right >= MIN_RIGHT, f"{right}/{len(QUESTIONS)} answers had the expected word"

"""Text end of utterance: the server's own LLM engine reads whether a pause's words end a sentence.

``turn_text_model`` "llm" (turns/decision.py, docs/turns.md). The words, tiny.en's trailing marks
removed, are written as a user turn of the ChatML template (the bundled SmolLM2's default system
turn) with the turn's ``<|im_end|>`` left open; the score is the probability that the next token is
a sentence's final mark (``.``, ``?``, ``!``) or ``<|im_end|>``: would the LM end the sentence here?
llama-server's ``/completion`` reports it in one call of one token: ``<|im_end|>`` is forced with a
logit bias (the bias acts in the sampler; the reported log-probability is the model's own over the
whole vocabulary) and ``n_probs`` lists the 100 likeliest tokens (a mark outside them counts 0).
Measured with the untuned bundled SmolLM2-135M-Instruct (tools/README.md, "Text end of
utterance"): 50-70 ms a score; every finished sentence of the benchmark scored >= 0.0186, 60 % of
the real fragments below 0.01.

Only a local engine (a llama-server child of this server) is asked: its answer is fast and free.
An engine that is not running, restarting or slow gives no score (``TextUnavailable`` or the
request's error): the pause is then judged without the text.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from mediaserver.config import Settings
from mediaserver.errors import ApiError
from mediaserver.llm.registry import BUNDLED_NAME, scores_turn_text
from mediaserver.llm.service import LlmService

log = logging.getLogger(__name__)

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
USER = "<|im_start|>user\n"
IM_END = "<|im_end|>"
SENTENCE_MARKS = (".", "?", "!")
TOP_TOKENS = 100  # the marks are read among the likeliest tokens
_TRAILING = re.compile(r"[\s.?!,;:…\-–—\"')\]]+$")


def bare_words(text: str) -> str:
    """The words without the ASR's trailing marks ("Remind me to buy." -> "Remind me to buy")."""
    return _TRAILING.sub("", " ".join(text.split()))


def prompt(words: str) -> str:
    """The scored prompt: the bare words as an open user turn."""
    return SYSTEM + USER + bare_words(words)


class TextUnavailable(Exception):
    """The engine cannot score now (not started, restarting): no text evidence for this pause."""


class TextEou:
    """The text scorer of an app (``turn_text_model`` "llm"): ``problem`` says why it is off (the
    LLM is off, or an upstream's), else ``probability(words)`` asks the default model's engine."""

    def __init__(self, settings: Settings, service: LlmService | None, problem: str | None = None) -> None:
        self.settings = settings
        self.service = service
        self.timeout_s = settings.turn_text_hold_ms / 1000.0
        self.mode = settings.turn_text_model
        self.problem = problem or self._problem()
        self._tokens: dict[str, tuple[int, tuple[int, ...]]] = {}  # engine URL -> (<|im_end|>, the marks)
        if self.problem is not None:
            # Asked for (llm), its absence is a warning; by default (auto) it is how the server is set up.
            level = logging.WARNING if self.mode == "llm" else logging.INFO
            message = "turn_text_model %s is off (%s): semantic turns judge pauses without the text"
            log.log(level, message, self.mode, self.problem)

    def _problem(self) -> str | None:
        service = self.service
        if service is None:
            return "the LLM is off"
        name = service.sources.default_name
        if name is None:
            return "no LLM model resolves"
        if service.sources.source(name).backend != "llama.cpp":
            return f"the LLM model {name!r} is an upstream's, not a local engine"
        if not scores_turn_text(self.settings, name):  # auto, and not the bundled model
            return (
                f"auto: the default LLM model {name!r} is not the bundled {BUNDLED_NAME!r} that turn_text_threshold "
                "was measured on (turn_text_model llm uses it all the same)"
            )
        return None

    @property
    def in_force(self) -> bool:
        return self.problem is None

    def status(self) -> dict[str, Any]:
        """What ``/health``'s ``turns`` says of it."""
        body: dict[str, Any] = {"text_model": self.mode, "text_model_in_force": "llm" if self.in_force else "off"}
        if self.problem is not None:
            body["text_model_problem"] = self.problem
        return body

    async def probability(self, words: str) -> float:
        """P(a final mark or <|im_end|>) after the bare words. TextUnavailable when the engine is not
        serving; the request's error (a timeout after ``turn_text_hold_ms``, a 5xx) otherwise."""
        service, name = self.service, self.service.sources.default_name if self.service else None
        if self.problem is not None or service is None or name is None:
            raise TextUnavailable(self.problem or "no LLM")
        engine = service.running_engine(name)
        if engine is None or not engine.ready:
            raise TextUnavailable(f"the engine of {name!r} is {engine.state if engine else 'not started'}")
        try:
            tokens = self._tokens.get(engine.base_url)
            if tokens is None:
                im_end = await engine.post_json("/tokenize", {"content": IM_END, "parse_special": True}, self.timeout_s)
                marks = [
                    (await engine.post_json("/tokenize", {"content": mark}, self.timeout_s))["tokens"]
                    for mark in SENTENCE_MARKS
                ]
                if len(im_end["tokens"]) != 1 or any(len(m) != 1 for m in marks):
                    raise TextUnavailable(f"{name!r} has no single {IM_END} token (not a ChatML model)")
                tokens = self._tokens[engine.base_url] = (int(im_end["tokens"][0]), tuple(int(m[0]) for m in marks))
            end, marks_ids = tokens
            body = {
                "prompt": prompt(words),
                "n_predict": 1,
                "n_probs": TOP_TOKENS,
                "temperature": 0,
                "cache_prompt": True,
                "logit_bias": [[end, 100]],
            }
            if engine.scoring_slot is not None:  # its own slot: no conversation's cache is evicted
                body["id_slot"] = engine.scoring_slot
            answer = await engine.post_json("/completion", body, self.timeout_s)
        except ApiError as exc:
            raise TextUnavailable(exc.message) from exc
        probs = answer["completion_probabilities"][0]
        if int(probs["id"]) != end:
            raise RuntimeError(f"the engine did not give the forced token {end} (gave {probs['id']})")
        found = {int(t["id"]): float(t["logprob"]) for t in probs["top_logprobs"]}
        found[end] = float(probs["logprob"])
        return min(1.0, sum(math.exp(found[t]) for t in {*marks_ids, end} if t in found))


def text_eou_of(settings: Settings, service: LlmService | None, llm_problem: str | None = None) -> TextEou | None:
    """The app's text scorer, or None with ``turn_text_model`` "off" (``llm_problem``: why the LLM is off)."""
    if settings.turn_text_model == "off":
        return None
    return TextEou(settings, service, llm_problem or (None if service is not None else "the LLM is off"))

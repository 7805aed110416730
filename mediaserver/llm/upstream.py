"""The one LLM client path: any OpenAI-compatible chat server (vLLM, llama.cpp's server, Ollama, OpenAI).

An upstream is how the LLM scales past one machine: vLLM serves int4 GPTQ/AWQ models across GPUs and
nodes, and this server only streams from it. The embedded engine is a managed upstream: the same
client drives the ``llama-server`` child of ``mediaserver.llm.engine_process`` (``engine=True`` adds
llama.cpp's own sampling fields: repetition penalty, DRY, prompt cache).

The ``openai`` client does the HTTP and SSE; its own retries are off because they also retry
timeouts and 5xx answers, which would multiply a hanging upstream's wait: here only connection errors
are retried (``llm_upstream_retries``: none made, or one dropped before the answer began, so the
request may have been sent; a generation changes nothing upstream, a repeat costs at most its
compute), a silent upstream is a 504 after ``llm_upstream_timeout_s``, and every upstream failure is
an answer that names the upstream.

An external upstream's prompt is held to ``llm_max_prompt_tokens`` before anything is sent: its
tokenizer is not at hand, so the prompt is estimated at ``llm_upstream_bytes_per_token`` (the
estimate the spoken answers are fitted to, ``LlmService.prompt_tokens``) and one over the cap is a
400 ``context_length_exceeded`` that says it is an estimate. The embedded engine counts exactly
itself (``engine.LlamaServerEngine.stream``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import openai

from mediaserver.config import Settings
from mediaserver.errors import ApiError, GatewayTimeout, InvalidParameter, Overloaded
from mediaserver.llm.prompt_size import PromptTooLong, estimate_tokens, prompt_bytes
from mediaserver.llm.tools import ToolCallDelta
from mediaserver.llm.types import (
    BackendEvent,
    BackendKind,
    ChatRequest,
    Finished,
    FinishReason,
    Progress,
    TextDelta,
    Usage,
)

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.25
# Words in the names of an OpenAI-compatible server's models that do not chat (OpenAI's own:
# whisper-1, tts-1, gpt-4o-mini-transcribe, text-embedding-3-small, dall-e-3, omni-moderation).
NOT_CHAT_WORDS = ("whisper", "tts", "transcribe", "embed", "dall-e", "moderation", "image", "realtime")


def _retry_after_s(exc: openai.APIStatusError) -> float | None:
    """The upstream's own ``Retry-After`` (seconds form), passed on to our client."""
    try:
        value = float(exc.response.headers.get("retry-after", ""))
    except (TypeError, ValueError, AttributeError):
        return None
    return value if value >= 0 else None


class UpstreamError(ApiError):
    status = 502
    code = "upstream_error"


class UpstreamTimeout(GatewayTimeout):
    status = 504
    code = "upstream_timeout"


class UpstreamChat:
    """Chat generation by an OpenAI-compatible server at ``base_url``."""

    kind: BackendKind = "upstream"

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float,
        connect_timeout_s: float,
        retries: int,
        max_concurrency: int,
        label: str | None = None,
        engine: bool = False,
        timeout_setting: str = "llm_upstream_timeout_s",
        bytes_per_token: float | None = None,
    ) -> None:
        """``bytes_per_token``: estimate each prompt at this many bytes a token and refuse one over
        ``max_prompt_tokens`` (an external upstream); None sends every prompt (the engine counts)."""
        self.base_url = base_url.rstrip("/")
        self._bytes_per_token = bytes_per_token
        self.max_concurrency = max_concurrency
        self.label = label or f"the upstream LLM at {self.base_url}"
        self._engine = engine
        self._retries = retries
        self._timeout_s = timeout_s
        self._timeout_setting = timeout_setting
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=api_key or "unused",
            timeout=openai.Timeout(timeout_s, connect=connect_timeout_s),
            max_retries=0,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> UpstreamChat:
        """The configured external upstream (``llm_upstream_*``)."""
        if not settings.llm_upstream_url:
            raise ValueError("llm_upstream_url is not set")
        return cls(
            settings.llm_upstream_url,
            api_key=settings.llm_upstream_api_key,
            timeout_s=settings.llm_upstream_timeout_s,
            connect_timeout_s=settings.llm_upstream_connect_timeout_s,
            retries=settings.llm_upstream_retries,
            max_concurrency=settings.llm_upstream_max_concurrency,
            bytes_per_token=settings.llm_upstream_bytes_per_token,
        )

    def _unreachable(self, exc: Exception) -> UpstreamError:
        return UpstreamError(f"{self.label} cannot be reached: {exc}")

    def _timed_out(self) -> UpstreamTimeout:
        return UpstreamTimeout(f"{self.label} sent nothing for {self._timeout_s:g} s ({self._timeout_setting})")

    def _status_error(self, exc: openai.APIStatusError) -> ApiError:
        message = _upstream_message(exc)
        status = exc.status_code
        if status == 429:
            return Overloaded(
                f"{self.label} is rate limiting (429): {message}",
                retry_after_s=_retry_after_s(exc),
            )
        if 400 <= status < 500 and status not in (401, 403, 404):
            # The request itself (a prompt over the upstream's context window ...): the client's to fix.
            return InvalidParameter(f"{self.label} refused the request ({status}): {message}")
        # 401/403/404 mean this server's settings are wrong (key, URL, model); 5xx the upstream failed.
        if self._engine and status == 503:  # llama-server still loading (after a restart): transient
            return Overloaded(f"{self.label} is not ready ({status}): {message}")
        return UpstreamError(f"{self.label} answered {status}: {message}")

    async def _call(self, fn: Any, **kwargs: Any) -> Any:
        """Call the client, retrying connection errors only (``APIConnectionError``: not timeouts, not answers)."""
        for attempt in range(self._retries + 1):
            try:
                return await fn(**kwargs)
            except openai.APITimeoutError:
                raise self._timed_out() from None
            except openai.APIConnectionError as exc:
                if attempt == self._retries:
                    raise self._unreachable(exc) from exc
                log.warning("%s: %s; retry %d/%d", self.label, exc, attempt + 1, self._retries)
                await asyncio.sleep(RETRY_BACKOFF_S * (attempt + 1))
            except openai.APIStatusError as exc:
                raise self._status_error(exc) from exc
        raise AssertionError("unreachable")

    def check_available(self) -> None:
        """An upstream's own failures are its answers (a 502 or 504 naming it)."""

    def check_prompt(self, request: ChatRequest, max_prompt_tokens: int) -> None:
        """Refuse (400) a prompt estimated over ``max_prompt_tokens``; nothing is sent for it."""
        if self._bytes_per_token is None:
            return
        estimate = estimate_tokens(request.messages, request.tools, self._bytes_per_token)
        if estimate > max_prompt_tokens:
            raise PromptTooLong(
                f"the prompt is about {estimate} tokens, an estimate ({prompt_bytes(request.messages, request.tools)} "
                f"bytes at {self._bytes_per_token:g} bytes a token, llm_upstream_bytes_per_token: the tokenizer of "
                f"{self.label} is not at hand); this server sends it at most {max_prompt_tokens} "
                "(llm_max_prompt_tokens)",
                param="messages",
            )

    async def list_models(self) -> list[tuple[str, bool]]:
        """The upstream's models, each with whether it looks like a chat model: not one whose
        ``kind`` (another mediaserver's listing) is not ``llm``, nor one named as OpenAI names its
        speech, image, embedding and moderation models (``whisper-1``, ``tts-1``, ...). A model
        another mediaserver lists as not an LLM is left out."""
        page = await self._call(self._client.models.list)
        found = []
        for model in page.data:
            kind = (model.model_extra or {}).get("kind")
            if kind is not None and kind != "llm":
                continue
            lowered = model.id.lower()
            found.append((model.id, not any(word in lowered for word in NOT_CHAT_WORDS)))
        return found

    async def stream(
        self,
        request: ChatRequest,
        cancel: threading.Event,
        max_prompt_tokens: int,
        *,
        slot: int | None = None,
        json_schema: Mapping[str, Any] | None = None,
    ) -> AsyncGenerator[BackendEvent, None]:
        """Deltas of one upstream generation; closing this iterator closes the HTTP stream, which
        is how vLLM, llama.cpp and Ollama learn to stop generating. ``json_schema`` constrains the
        answer's text to JSON matching it (``response_format``). An external upstream's prompt
        estimated over ``max_prompt_tokens`` is refused first (``check_prompt``)."""
        self.check_prompt(request, max_prompt_tokens)
        kwargs: dict[str, Any] = {
            "model": request.model,
            # The engine parses the calls' arguments (tools.engine_arguments); an upstream takes any text.
            "messages": [m.openai(json_arguments=self._engine) for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        if request.stop:
            kwargs["stop"] = list(request.stop)
        if request.seed is not None:
            kwargs["seed"] = request.seed
        if request.frequency_penalty is not None:
            kwargs["frequency_penalty"] = request.frequency_penalty
        if request.presence_penalty is not None:
            kwargs["presence_penalty"] = request.presence_penalty
        if json_schema is not None:
            schema = {"name": "answer", "schema": dict(json_schema)}
            kwargs["response_format"] = {"type": "json_schema", "json_schema": schema}
        if request.tools is not None:
            kwargs["tools"] = [tool.openai() for tool in request.tools.tools]
            kwargs["tool_choice"] = request.tools.openai_choice()
            if request.tools.parallel is not None:
                kwargs["parallel_tool_calls"] = request.tools.parallel
        if self._engine:
            # llama.cpp's own fields. A seeded request is evaluated from scratch (no prompt cache):
            # logits of a prompt partly served from the cache differ in the last bits, enough to
            # change a sampled token, and the same seed must give the same answer.
            extra: dict[str, Any] = {"cache_prompt": request.seed is None}
            # Every chunk then says the tokens taken so far (``Progress``): a generation cancelled
            # before its last chunk (a Realtime response.cancel, a barge-in) still reports its usage.
            extra["timings_per_token"] = True
            if slot is not None:
                extra["id_slot"] = slot
            if request.repeat_penalty is not None:
                extra["repeat_penalty"] = request.repeat_penalty
            if request.dry_multiplier is not None:
                extra["dry_multiplier"] = request.dry_multiplier
            kwargs["extra_body"] = extra
        stream = await self._call(self._client.chat.completions.create, **kwargs)
        finish: FinishReason = "stop"
        usage: Usage | None = None
        chunks = 0
        try:
            async for chunk in stream:
                chunks += 1
                if cancel.is_set():
                    finish = "cancelled"
                    break
                if chunk.usage is not None:
                    details = chunk.usage.prompt_tokens_details
                    cached = details.cached_tokens if details is not None else None
                    usage = Usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens, cached)
                elif self._engine and (progress := _progress(chunk)) is not None:
                    yield progress
                for choice in chunk.choices:
                    if choice.delta is not None and choice.delta.content:
                        yield TextDelta(choice.delta.content)
                    for call in (choice.delta.tool_calls if choice.delta is not None else None) or ():
                        function = call.function
                        yield ToolCallDelta(
                            call.index,
                            call.id or None,
                            function.name if function is not None else None,
                            (function.arguments if function is not None else None) or "",
                        )
                    if choice.finish_reason in ("length", "tool_calls"):
                        finish = choice.finish_reason
        except openai.APITimeoutError:
            raise self._timed_out() from None
        except openai.APIError as exc:  # the connection broke, or an error event inside the stream
            raise UpstreamError(f"{self.label} broke off its answer: {exc.message}") from exc
        finally:
            await stream.close()
        if chunks == 0:
            # Every OpenAI-compatible server sends at least one chunk; none means it failed after
            # answering 200 (llama-cpp-python's server does this for a prompt over its context).
            raise UpstreamError(f"{self.label} ended its stream without an answer")
        yield Finished(finish, usage)

    async def aclose(self) -> None:
        await self._client.close()


def _progress(chunk: Any) -> Progress | None:
    """llama-server's per-token ``timings`` on a chunk (``timings_per_token``) as the usage so far:
    the prompt's tokens (``cache_n`` of them from the prompt cache, ``prompt_n`` evaluated) and
    the tokens generated (``predicted_n``)."""
    timings = (chunk.model_extra or {}).get("timings")
    if not isinstance(timings, dict):
        return None
    try:
        cached, evaluated, predicted = (int(timings[key]) for key in ("cache_n", "prompt_n", "predicted_n"))
    except (KeyError, TypeError, ValueError):
        return None
    return Progress(Usage(max(0, cached) + max(0, evaluated), max(0, predicted), max(0, cached)))


def _upstream_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return exc.message

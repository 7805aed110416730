"""What the LLM service generates with: an ``LlmEngine``. There are two, on one client path.

- ``UpstreamChat`` (``mediaserver.llm.upstream``): an external OpenAI-compatible server.
- ``LlamaServerEngine`` (here): a local GGUF served by a supervised ``llama-server`` child
  (``mediaserver.llm.engine_process``), driven by that same ``UpstreamChat`` client on loopback:
  continuous batching over ``llm_slots`` slots, a prompt cache per slot. The service's queue
  admits ``llm_slots`` generations at once, so the engine itself never queues.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from mediaserver.config import Settings
from mediaserver.devices import DeviceChoice
from mediaserver.errors import InvalidParameter, ModelUnavailable, Overloaded
from mediaserver.llm.engine_process import LlamaServerProcess, template_body
from mediaserver.llm.forced_calls import as_call, call_schema, forced_tools
from mediaserver.llm.prompt_size import TEMPLATE_BYTES_PER_MESSAGE, TOOLS_PREAMBLE_BYTES, PromptTooLong
from mediaserver.llm.registry import LlmSource, is_hub_id
from mediaserver.llm.slots import SlotAffinity
from mediaserver.llm.tools import ToolConfig
from mediaserver.llm.types import BackendEvent, BackendKind, ChatMessage, ChatRequest, Progress
from mediaserver.llm.upstream import UpstreamChat, UpstreamError

log = logging.getLogger(__name__)

ENGINE_CONNECT_RETRIES = 2
ENGINE_RESTART_RETRIES = 1  # a request that met a restarting engine is sent once more


def hub_gguf(location: str, settings: Settings) -> str:
    """The local file of a Hugging Face "owner/repo:file.gguf" id (downloaded if allowed; blocking)."""
    from huggingface_hub import snapshot_download

    repo_id, _, pattern = location.partition(":")
    try:
        folder = snapshot_download(
            repo_id,
            allow_patterns=[pattern],
            local_files_only=not settings.allow_model_download,
            cache_dir=str(settings.model_cache_dir / "gguf"),
        )
    except Exception as exc:
        raise ModelUnavailable(f"LLM {location!r} could not be fetched: {exc}") from exc
    found = sorted(Path(folder).glob(pattern))
    if not found:
        raise ModelUnavailable(f"LLM {location!r}: no file matches {pattern!r} in {repo_id}")
    return str(found[0])


class LlmEngine(Protocol):
    """What the service needs of an engine: stream a generation, say how many run at once."""

    kind: BackendKind
    max_concurrency: int

    def stream(
        self, request: ChatRequest, cancel: threading.Event, max_prompt_tokens: int
    ) -> AsyncGenerator[BackendEvent, None]:
        """Deltas then ``Finished``; closing the iterator (or ``cancel``) stops the generation."""
        ...

    def check_available(self) -> None:
        """Raise (a 503) if a request cannot be served now, before it waits in the queue."""
        ...

    async def aclose(self) -> None: ...


class LlamaServerEngine:
    """One local GGUF on its own llama-server child."""

    kind: BackendKind = "llama.cpp"

    def __init__(self, process: LlamaServerProcess, settings: Settings) -> None:
        self.process = process
        self.name = process.alias
        self.max_concurrency = process.slots
        self.affinity = SlotAffinity(process.slots)
        self.client = UpstreamChat(
            process.base_url + "/v1",
            timeout_s=settings.llm_request_timeout_s,
            connect_timeout_s=settings.llm_upstream_connect_timeout_s,
            # llama-server closes a keep-alive connection idle for 5 s; a request that races that
            # close fails to connect before anything was sent, and is sent again on a new one.
            retries=ENGINE_CONNECT_RETRIES,
            max_concurrency=process.slots,
            label=f"the llama-server engine of {process.alias!r}",
            engine=True,
            timeout_setting="llm_request_timeout_s",
        )

    @classmethod
    async def start(
        cls,
        source: LlmSource,
        settings: Settings,
        device: DeviceChoice | None,
        on_restart: Any = None,
        *,
        scoring_slot: bool = False,
    ) -> LlamaServerEngine:
        """Start the child and wait until it answers (ModelUnavailable naming why if it cannot);
        ``scoring_slot``: one more slot for the turn text scorer (LlamaServerProcess)."""
        location = await asyncio.to_thread(hub_gguf, source.location, settings) if source.is_hub_id else source.location
        projector = settings.llm_vision_projectors.get(source.name)
        if projector is not None and is_hub_id(projector):
            projector = await asyncio.to_thread(hub_gguf, projector, settings)
        process = LlamaServerProcess(
            source.name,
            location,
            settings,
            device,
            on_restart=on_restart,
            projector_path=projector,
            scoring_slot=scoring_slot,
        )
        try:
            await process.start()
        except BaseException:
            await process.aclose()
            raise
        return cls(process, settings)

    def check_available(self) -> None:
        # A wedged child: 503 at once, not a wait in the queue behind requests stuck on it.
        self.process.check_responsive()

    async def stream(
        self, request: ChatRequest, cancel: threading.Event, max_prompt_tokens: int
    ) -> AsyncGenerator[BackendEvent, None]:
        await self.process.wait_ready()
        images = [image for message in request.messages for image in message.images]
        remote = next((image for image in images if not image.url.startswith("data:")), None)
        if remote is not None and self.process.supports_images:
            # llama-server would fetch the URL itself, from this host, unchecked: a client could
            # make the server reach addresses only it can see. An upstream gets URLs as sent.
            raise InvalidParameter(
                f"'{remote.where}': the embedded engine takes images as data:image/...;base64, URIs, "
                "not URLs it would fetch",
                param="messages",
            )
        if images and not self.process.supports_images:
            raise InvalidParameter(
                f"'{images[0].where}' is an image, and model {request.model!r} reads text only: give it a vision "
                "projector (llm_vision_projectors) if it is a vision model, or use an LLM server with a vision "
                "model (llm_upstream_url)",
                param="messages",
            )
        tools = request.tools
        if (tools is not None or any(m.role == "tool" or m.tool_calls for m in request.messages)) and not (
            self.process.supports_tools
        ):
            raise InvalidParameter(
                f"tools (function calling): the chat template of model {request.model!r} renders no tools; give "
                "llama-server one that does (llm_chat_templates) or use an LLM server that runs them "
                "(llm_upstream_url)",
                param="tools",
            )
        limit = min(max_prompt_tokens, self.process.settings.llm_context_tokens - 1)
        # A byte-level tokenizer never makes more tokens than bytes: only a prompt that might be
        # too long is counted exactly (llama-server's own template and tokenizer, two loopback calls).
        size = sum(len(m.content.encode()) + TEMPLATE_BYTES_PER_MESSAGE for m in request.messages)
        size += sum(len(json.dumps(call.openai())) for m in request.messages for call in m.tool_calls)
        if tools is not None:
            size += TOOLS_PREAMBLE_BYTES + sum(len(json.dumps(tool.openai())) for tool in tools.tools)
        if size > limit:
            count = await self.process.count_prompt_tokens(request.messages, tools)
            if count > limit:
                raise PromptTooLong(
                    f"the prompt is {count} tokens; this model takes at most {limit} (context window "
                    f"{self.process.settings.llm_context_tokens} tokens per slot, llm_max_prompt_tokens "
                    f"{max_prompt_tokens})",
                    param="messages",
                )
        slot = self.affinity.take(request.messages)
        try:
            forced = forced_tools(tools) if tools is not None else None
            if forced is None:
                async for event in self._stream_in(slot, request, cancel, max_prompt_tokens):
                    yield event
            else:
                # The tools stay in the prompt; the answer is one call, constrained (forced_calls).
                listed = replace(request, tools=ToolConfig(forced, "auto"))
                events = self._stream_in(slot, listed, cancel, max_prompt_tokens, call_schema(forced))
                async for event in as_call(events, forced):
                    yield event
        finally:
            self.affinity.give(slot)

    async def _stream_in(
        self,
        slot: int,
        request: ChatRequest,
        cancel: threading.Event,
        max_prompt_tokens: int,
        json_schema: dict[str, Any] | None = None,
    ) -> AsyncGenerator[BackendEvent, None]:
        for attempt in range(ENGINE_RESTART_RETRIES + 1):
            child = self.process.child()  # the child this attempt is sent to
            events = self.client.stream(request, cancel, max_prompt_tokens, slot=slot, json_schema=json_schema)
            answered = False
            try:
                async for event in events:
                    answered = answered or not isinstance(event, Progress)  # (the prompt's, before any token)
                    yield event
                return
            except (UpstreamError, Overloaded):
                # Sent while the engine died or restarted: nothing was generated yet, so wait for the
                # new one and send again. Mid-answer, it is an error. Whether the child died is the
                # supervisor's to say once it has seen the exit (however long that takes under load);
                # a child that still answers its health check failed this request on its own.
                if answered or attempt == ENGINE_RESTART_RETRIES or not await self.process.child_failed(child):
                    raise
                log.info("the engine of %s restarted under a request: sending it again", self.name)
                await self.process.wait_ready()
            finally:
                await events.aclose()  # closes the HTTP stream: llama-server frees the slot at once

    async def prefill(
        self, messages: Sequence[ChatMessage], tools: ToolConfig | None, *, question: bool = False
    ) -> int:
        """Put the prompt of ``messages`` in the cache of the slot their request will take
        (``SlotAffinity.peek``): a new conversation's system prompt, or (``question``) a question
        still being spoken, which goes only to its conversation's own slot (never evicting
        another's); that request then evaluates only what follows. Nothing when that slot is busy
        or the engine is not serving; the prompt tokens evaluated."""
        slot, process = self.affinity.peek(messages, own=question), self.process
        if slot is None or not process.ready:
            return 0
        timeout_s = process.settings.llm_request_timeout_s
        prompt = (await process.post_json("/apply-template", template_body(messages, tools), timeout_s))["prompt"]
        if self.affinity.peek(messages, own=question) != slot:
            return 0  # taken meanwhile (an answer now runs there): its cache is not to be overwritten
        body = {"prompt": prompt, "n_predict": 0, "id_slot": slot, "cache_prompt": True}  # evaluate, write nothing
        self.affinity.prefilling(slot, messages)  # (a request that begins with it waits for it there)
        try:
            done = await process.post_json("/completion", body, timeout_s)
        finally:
            self.affinity.prefilled(slot)
        return int(done.get("timings", {}).get("prompt_n", 0))

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.process.aclose()

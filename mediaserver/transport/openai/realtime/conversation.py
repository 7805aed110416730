"""A Realtime conversation: the items, the one response at a time, and the voice loop behind them.

Items are added, retrieved, truncated and deleted here, and transcribed when they bring input
audio. A response is created here and run by ``response_rounds.ResponseRounds``: its rounds (one
turn of the session's ``Assistant`` each, MCP calls between them), its lifecycle events and how
each status ends it are described there; the assistant's deltas come back through
``on_assistant_event``.

Audio leaves in one of two ways. Over WebSocket (``deltas``) a sender drains the assistant's
``AudioOut`` into delta events, at most ``realtime_audio_lead_ms`` ahead of real time, so a
barge-in drops what the client has not received. Over WebRTC (``track``) the call's outbound track
drains it, and the data channel gets ``output_audio_buffer.started`` / ``stopped`` / ``cleared``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from dataclasses import replace
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from mediaserver.asr.service import AsrService
from mediaserver.assistant.audio_out import AudioOut
from mediaserver.assistant.pacing import send_paced
from mediaserver.assistant.turns import Assistant
from mediaserver.audio.echo_line import EchoLine
from mediaserver.audio.stream_decode import encode_g711
from mediaserver.config import Settings
from mediaserver.errors import ApiError
from mediaserver.events import (
    SAMPLE_RATE_HZ,
    AssistantAudioStarted,
    AssistantText,
    AssistantToolCallDelta,
    Priority,
    SessionEvent,
)
from mediaserver.llm.tools import ToolConfig
from mediaserver.llm.types import ChatMessage
from mediaserver.metrics import Metrics
from mediaserver.transport.openai.realtime.config import InputFormat
from mediaserver.transport.openai.realtime.conversation_config import ConversationConfig, ResponseOptions
from mediaserver.transport.openai.realtime.input_transcription import Host
from mediaserver.transport.openai.realtime.items import Item, Items, NewItem, parse_item
from mediaserver.transport.openai.realtime.mcp_tools import McpTool
from mediaserver.transport.openai.realtime.response_rounds import ResponseRounds
from mediaserver.transport.openai.realtime.responses import Response, describe_response
from mediaserver.transport.openai.realtime.tool_items import ToolItems
from mediaserver.transport.openai.realtime.values import EventError, new_id

log = logging.getLogger(__name__)

AudioMode = Literal["deltas", "track"]
MAX_FRAMES_PER_DELTA: Final = 5  # 100 ms of audio per response.output_audio.delta


def _decode(fmt: InputFormat, audio: bytes) -> npt.NDArray[np.float32]:
    decoder = fmt.decoder()
    samples = decoder.decode(audio)
    tail = decoder.flush()
    return np.concatenate([samples, tail]) if tail.size else samples


class Conversation:
    """One session's conversation: items, the response in progress, and its audio out."""

    def __init__(
        self,
        host: Host,
        settings: Settings,
        asr: AsrService,
        assistant: Assistant,
        config: ConversationConfig,
        audio: AudioMode,
        metrics: Metrics | None = None,
    ) -> None:
        self.host = host
        self.settings = settings
        self.asr = asr
        self.assistant = assistant
        self.config = config
        self.audio = audio
        self.items = Items(settings.realtime_max_items)
        self.response: Response | None = None
        self.responses = 0
        self._sender: asyncio.Task[None] | None = None
        self._closed = False
        # The instructions, model and tools prefilled.
        self._prefilled: tuple[str, str | None, ToolConfig | None] | None = None
        # The session's echo canceller, when it runs (audio/echo.py): the deltas sent are its reference.
        # Where the answer item being sent plays: for each delta, (ms into the item, stream-clock
        # sample it plays from), so a truncate at ``audio_end_ms`` cuts the reference there.
        self.echo: EchoLine | None = None
        self._echo_item: tuple[EchoLine, str, list[tuple[float, int]]] | None = None
        self._echo_delta_ms = 0.0  # the length of the latest delta sent
        self.tools = ToolItems(host, settings, metrics or Metrics(), self.items, self.item_added, self.item_done)
        self.rounds = ResponseRounds(self)
        if audio == "deltas":
            self.ensure_out(config.output_format)

    @property
    def conversation_id(self) -> str:
        return f"conv_{self.host.id.removeprefix('sess_')}"

    # --- names --------------------------------------------------------------------------------

    def item_added(self, item: Item, previous_item_id: str | None) -> None:
        described = item.describe(beta=self.host.beta)
        if self.host.beta:
            self.host.send("conversation.item.created", previous_item_id=previous_item_id, item=described)
        else:
            self.host.send("conversation.item.added", previous_item_id=previous_item_id, item=described)

    def item_done(self, item: Item, previous_item_id: str | None) -> None:
        if not self.host.beta:
            self.host.send("conversation.item.done", previous_item_id=previous_item_id, item=item.describe(beta=False))

    def event_name(self, ga: str, beta: str) -> str:
        return beta if self.host.beta else ga

    # --- the user's side ----------------------------------------------------------------------

    def user_audio(self, item_id: str) -> str | None:
        """A committed input audio buffer became a user item (its transcript follows)."""
        return self.items.add(Item(item_id, "user", "input_audio", None))

    def transcribed(self, item_id: str, transcript: str | None) -> None:
        item = self.items.get(item_id)
        if item is not None:
            item.set_text(transcript or "")

    async def create_item(self, new: NewItem, previous_item_id: str | None, client_event_id: str | None) -> None:
        """``conversation.item.create``: text now, input audio once transcribed."""
        self.items.check_insert(new.id, previous_item_id)
        item_id = new.id or new_id("item")
        if new.type == "function_call_output" and not self.items.has_call(new.call_id or ""):
            raise EventError(
                "invalid_value",
                f"Invalid 'item.call_id': no function call with call_id {new.call_id!r} is in the conversation.",
                "item.call_id",
            )
        if new.type != "message":
            item = Item(item_id, new.role, new.kind, new.text or "", type=new.type, call_id=new.call_id, name=new.name)
        elif new.audio is None:
            item = Item(item_id, new.role, new.kind, new.text or "")
        else:
            item = Item(item_id, "user", "input_audio", None)
        previous = self.items.add(item, previous_item_id)
        self.item_added(item, previous)
        self.item_done(item, previous)
        if new.audio is not None:
            self.host.spawn(self._transcribe(item, new.audio, new.text), "realtime-item-transcribe")

    async def _transcribe(self, item: Item, audio: bytes, text: str | None) -> None:
        samples = await asyncio.to_thread(_decode, self.config.input.input_format, audio)  # up to 15 MiB
        self.asr.metrics.audio_seconds.labels("realtime").inc(samples.size / SAMPLE_RATE_HZ)  # (a docs audit)
        options = self.config.input.stream_options(self.settings).transcription
        try:
            result = await self.asr.transcribe(
                samples, options, model=self.config.input.resolved_model, priority=Priority.FINAL
            )
        except ApiError as exc:
            item.set_text(text or "")
            kind = "invalid_request_error" if exc.status < 500 else "server_error"
            self.host.send(
                "conversation.item.input_audio_transcription.failed",
                item_id=item.id,
                content_index=0,
                error={"type": kind, "code": exc.code, "message": exc.message, "param": None},
            )
            return
        transcript = " ".join(t for t in (text, result.text.strip()) if t)
        item.set_text(transcript)
        self.host.send(
            "conversation.item.input_audio_transcription.completed",
            item_id=item.id,
            content_index=0,
            transcript=result.text.strip(),
            usage={"type": "duration", "seconds": round(samples.size / 16000, 3)},
        )

    async def delete_item(self, item_id: str, client_event_id: str | None) -> None:
        if item_id not in self.items:
            raise EventError(
                "item_delete_invalid_item_id",
                f"Error deleting item: the item with id '{item_id}' does not exist.",
                "item_id",
            )
        if self.response is not None and self.response.item is not None and self.response.item.id == item_id:
            await self.cancel_response("client_cancelled")
        self.items.delete(item_id)
        self.host.send("conversation.item.deleted", item_id=item_id)

    def retrieve_item(self, item_id: str) -> None:
        item = self.items.get(item_id)
        if item is None:
            raise EventError(
                "item_retrieve_invalid_item_id",
                f"Error retrieving item: the item with id '{item_id}' does not exist.",
                "item_id",
            )
        self.host.send("conversation.item.retrieved", item=item.describe(beta=self.host.beta))

    async def truncate_item(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        item = self.items.get(item_id)
        if item is None:
            raise EventError(
                "item_truncate_invalid_item_id",
                f"Error truncating item: the item with id '{item_id}' does not exist.",
                "item_id",
            )
        if item.kind != "output_audio":
            raise EventError("invalid_value", "Only model output audio messages can be truncated.", "item_id")
        if content_index != 0:
            raise EventError(
                "invalid_value",
                f"Invalid 'content_index': {content_index}. The item has one content part (0).",
                "content_index",
            )
        if self.response is not None and self.response.item is item:
            await self.cancel_response("client_cancelled")  # the client stopped playing it
        if audio_end_ms > item.audio_ms:
            raise EventError(
                "invalid_value",
                f"Audio content of {item.audio_ms}ms is already shorter than {audio_end_ms}ms",
                "audio_end_ms",
            )
        item.truncate(audio_end_ms)
        self._cut_echo(item_id, audio_end_ms)
        self.host.send(
            "conversation.item.truncated", item_id=item_id, content_index=content_index, audio_end_ms=audio_end_ms
        )

    # --- responses ------------------------------------------------------------------------------

    def _context_of(self, options: ResponseOptions) -> list[ChatMessage] | None:
        """``response.input`` as chat messages (references to existing items, or text messages)."""
        if options.input is None:
            return None
        context: list[ChatMessage] = []
        for index, raw in enumerate(options.input):
            param = f"response.input[{index}]"
            if raw.get("type") == "item_reference":
                ref = raw.get("id")
                item = self.items.get(ref) if isinstance(ref, str) else None
                if item is None:
                    raise EventError(
                        "invalid_value",
                        f"Invalid '{param}.id': the item with id {ref!r} does not exist.",
                        f"{param}.id",
                    )
                context += self.items.context([item.id])
                continue
            new = parse_item(raw, max_audio_bytes=0, param=param)
            if new.text and new.text.strip():
                context.append(ChatMessage(new.role, new.text.strip()))
        return context

    def _check_stages(self, options: ResponseOptions, client_event_id: str | None) -> bool:
        why = self.assistant.unavailable("llm")
        if why is not None:
            self.host.send_error(
                "feature_disabled",
                f"This server cannot answer: the LLM is disabled ({why}).",
                client_event_id=client_event_id,
            )
            return False
        why = self.assistant.unavailable("tts")
        if options.modality == "audio" and why is not None:
            self.host.send_error(
                "feature_disabled",
                f"This server cannot speak answers: TTS is disabled ({why}). Ask for text instead: "
                "output_modalities ['text'] (beta: modalities ['text']).",
                param="session.output_modalities",
                client_event_id=client_event_id,
            )
            return False
        return True

    async def create_response(
        self,
        options: ResponseOptions,
        client_event_id: str | None = None,
        *,
        speech_ended_at: float | None = None,
    ) -> None:
        if self._closed:
            return
        if self.response is not None:
            raise EventError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.response.id}. Wait until the "
                "response is finished before creating a new one.",
            )
        context = self._context_of(options)
        if not self._check_stages(options, client_event_id):
            return
        if options.in_conversation:
            options = replace(options, conversation_id=self.conversation_id)
        response = Response(new_id("resp"), options, context)
        self.response = response
        self.responses += 1
        self.host.send("response.created", response=describe_response(response, "in_progress", beta=self.host.beta))
        limit = options.max_tokens
        self.host.send(
            "rate_limits.updated",
            rate_limits=[{"name": "tokens", "limit": limit, "remaining": limit, "reset_seconds": 0.0}],
        )
        response.task = self.host.spawn(self.rounds.run(response, speech_ended_at), "realtime-response")

    async def auto_respond(self, speech_ended_at: float | None) -> None:
        """Server VAD ended a user turn and its transcript is in: answer it (``create_response``)."""
        turn = self.config.input.turn_detection
        if turn is None or not turn.create_response:
            return
        if self.response is not None:
            log.info("realtime session %s: still answering; no response for the new turn", self.host.id)
            return
        await self.create_response(ResponseOptions.of(self.config), speech_ended_at=speech_ended_at)

    async def on_speech_started(self) -> None:
        turn = self.config.input.turn_detection
        if turn is not None and turn.interrupt_response and self.response is not None:
            await self.cancel_response("turn_detected")

    async def cancel_response(self, reason: str, *, from_client: bool = False, response_id: str | None = None) -> None:
        """Stop the response in progress and wait until its ``response.done`` has been sent."""
        response = self.response
        if response is None or (response_id is not None and response_id != response.id):
            if from_client:
                raise EventError(
                    "response_cancel_not_active",
                    "Cancellation failed: no active response found",
                    "response_id" if response_id is not None else None,
                )
            return
        response.reason = response.reason or reason
        if response.turn is not None and not response.turn.settled:
            await self.assistant.interrupt()
        elif response.task is not None and (response.turn is None or response.running_tools):
            response.task.cancel()  # not begun, or between rounds (MCP calls running)
        if response.task is not None and response.task is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await response.task

    def prefill(self) -> None:
        """Have the LLM engine evaluate the session's ``instructions`` and function tools before its
        first response, into the slot that response takes (``Assistant.prefill``), as that response
        will render them (``ConversationConfig.tool_config``): only while the conversation has no
        items, once per instructions, tools and model, and not for a session with MCP servers (their
        tools join each response once listed)."""
        config = self.config
        if len(self.items) or config.mcp:
            return
        tools = config.tool_config()
        key = (config.instructions, config.llm_model, tools)
        if key == self._prefilled:
            return
        self._prefilled = key
        base = self.assistant.options
        options = replace(base, system_prompt=config.instructions, model=config.llm_model or base.model, tools=tools)
        self.assistant.prefill(options, own_tools=False)

    def set_mcp(self, declared: tuple[McpTool, ...]) -> None:
        """The session's MCP tools changed (or were first given): connect and list the new set."""
        self.tools.set_mcp(declared)

    # --- the assistant's events -----------------------------------------------------------------

    async def on_assistant_event(self, event: SessionEvent) -> None:
        response = self.response
        if response is None or response.turn is None or response.item is None:
            return
        if getattr(event, "turn", None) != response.turn.number:
            return
        if isinstance(event, AssistantText) and event.delta:
            kind = (
                self.event_name("response.output_audio_transcript.delta", "response.audio_transcript.delta")
                if response.item.kind == "output_audio"
                else self.event_name("response.output_text.delta", "response.text.delta")
            )
            self.host.send(
                kind,
                response_id=response.id,
                item_id=response.item.id,
                output_index=response.item_index,
                content_index=0,
                delta=event.delta,
            )
        elif isinstance(event, AssistantToolCallDelta):
            call_id = event.call_id or f"call_{response.id}_{event.index}"
            self.tools.delta(response, event.index, call_id, event.name or "", event.arguments)
        elif isinstance(event, AssistantAudioStarted):
            response.audio_started = True
            if self.audio == "track":
                self.host.send("output_audio_buffer.started", response_id=response.id)

    # --- audio out over the socket ----------------------------------------------------------------

    def ensure_out(self, fmt: InputFormat) -> None:
        rate = fmt.rate_hz
        out = self.assistant.out
        if out is not None and out.sample_rate_hz == rate and self._sender is not None and not self._sender.done():
            return
        if out is not None:
            out.close()
        out = AudioOut(rate)
        self.assistant.out = out
        self._sender = self.host.spawn(self._send_audio(out), "realtime-audio-out")

    async def _send_audio(self, out: AudioOut) -> None:
        """Frames → delta events, paced at most ``realtime_audio_lead_ms`` ahead of real time."""
        lead_s = self.settings.realtime_audio_lead_ms / 1000.0
        await send_paced(out, self._send_delta, lead_s=lead_s, max_frames=MAX_FRAMES_PER_DELTA, align=self._echo_align)

    async def _echo_align(self) -> None:
        if self.echo is not None and self.response is not None and self.response.item is not None:
            await self.echo.align_start()

    def _send_delta(self, pcm: bytes) -> None:
        response = self.response
        if response is None or response.item is None:
            return
        fmt = response.options.output_format
        if self.echo is not None:
            self._echo_sent(self.echo, response.item.id, pcm, fmt.rate_hz)
        data = pcm if fmt.is_pcm else encode_g711(pcm, "ulaw" if fmt.type == "audio/pcmu" else "alaw")
        self.host.send(
            self.event_name("response.output_audio.delta", "response.audio.delta"),
            response_id=response.id,
            item_id=response.item.id,
            output_index=response.item_index,
            content_index=0,
            delta=base64.b64encode(data).decode("ascii"),
        )

    def _echo_sent(self, echo: EchoLine, item_id: str, pcm: bytes, rate_hz: int) -> None:
        at = echo.sent(pcm, rate_hz)
        item = self._echo_item
        if item is None or item[0] is not echo or item[1] != item_id:
            item = self._echo_item = (echo, item_id, [])
        marks = item[2]
        offset_ms = marks[-1][0] + self._echo_delta_ms if marks else 0.0
        marks.append((offset_ms, at))
        self._echo_delta_ms = len(pcm) / 2 / rate_hz * 1000.0

    def _cut_echo(self, item_id: str, audio_end_ms: int) -> None:
        """The client stopped playing the item at ``audio_end_ms``: the rest is no reference."""
        item = self._echo_item
        if self.echo is None or item is None or item[0] is not self.echo or item[1] != item_id:
            return
        played = [(offset_ms, at) for offset_ms, at in item[2] if offset_ms <= audio_end_ms]
        if played:
            offset_ms, at = played[-1]
            self.echo.cut(at + round((audio_end_ms - offset_ms) * SAMPLE_RATE_HZ / 1000))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        response = self.response
        if response is not None and response.task is not None:
            response.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await response.task
        await self.tools.aclose()
        await self.assistant.aclose()


class VoiceTurns:
    """The session core's view of a conversation (``StreamSession.assistant``): a final transcript
    of server VAD creates a response when ``create_response`` is on."""

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation

    async def answer(self, user_text: str, *, speech_ended_at: float | None = None) -> None:
        await self.conversation.auto_respond(speech_ended_at)

    async def interrupt(self) -> bool:
        active = self.conversation.response is not None
        await self.conversation.cancel_response("turn_detected")
        return active

    def observe_transcript(self, seconds: float) -> None:
        self.conversation.assistant.observe_transcript(seconds)

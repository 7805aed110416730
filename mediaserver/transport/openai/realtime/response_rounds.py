"""A Realtime response's rounds: the assistant turns that answer it, and the events that close it.

A response is one turn of the session's ``Assistant`` (mediaserver/assistant): the conversation's
items become its chat context, the response's options its per-turn options, and its events come
back as server events (``Conversation.on_assistant_event`` sends the deltas). There is no second
LLM→TTS pipeline here.

Lifecycle of a response (GA names; beta clients get ``response.audio.delta``,
``response.audio_transcript.delta``, ``response.text.delta`` and ``conversation.item.created``):
``response.created`` (+ ``rate_limits.updated``) at once; when the user items it answers have their
transcripts, ``response.output_item.added``, ``conversation.item.added``, ``response.content_part.added``;
then ``response.output_audio_transcript.delta`` with the text as the LLM writes it and
``response.output_audio.delta`` with base64 PCM16 (or ``response.output_text.delta`` for a text
answer); at the end ``response.output_audio.done``, ``...transcript.done``, ``response.content_part.done``,
``response.output_item.done``, ``conversation.item.done`` and ``response.done`` with the status
(``completed``; ``incomplete`` when the token cap cut it; ``cancelled`` by the user speaking
(``turn_detected``) or ``response.cancel`` (``client_cancelled``); ``failed`` with the error) and
``usage``. A cancelled answer keeps, in its item and its ``.done`` events, the words whose audio was
sent (the text deltas may have run ahead); ``conversation.item.truncate`` cuts it further to what
the client played.

Tools: a call the model makes is an output item after the message (``tool_items.py``). A
``function_call`` ends the response (the client runs it). A call of one of the session's MCP
servers' tools (``type: "mcp"``) is an ``mcp_call`` run here; the response then goes on with
another round, a new assistant turn that reads the results, whose answer is a new message item of
the same response (``ResponseRounds.run``), up to ``mcp_max_calls_per_turn`` calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any, Literal, Protocol

from mediaserver.assistant.turn_types import AssistantOptions, TurnOutcome
from mediaserver.assistant.turns import Assistant
from mediaserver.config import Settings
from mediaserver.llm.tools import engine_arguments
from mediaserver.llm.types import ChatMessage
from mediaserver.transport.openai.realtime.config import InputFormat
from mediaserver.transport.openai.realtime.conversation_config import ConversationConfig, ResponseOptions
from mediaserver.transport.openai.realtime.input_transcription import Host
from mediaserver.transport.openai.realtime.items import ContentKind, Item, Items
from mediaserver.transport.openai.realtime.responses import Response, describe_response, status_of
from mediaserver.transport.openai.realtime.tool_items import ToolItems
from mediaserver.transport.openai.realtime.values import new_id


class RoundsConversation(Protocol):
    """What the rounds read and change of their conversation (``conversation.Conversation``, which
    owns them): its parts, its config, the response in progress (cleared here when it ends), and
    how it announces items and names events."""

    response: Response | None

    @property
    def host(self) -> Host: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def assistant(self) -> Assistant: ...

    @property
    def items(self) -> Items: ...

    @property
    def tools(self) -> ToolItems: ...

    @property
    def audio(self) -> Literal["deltas", "track"]: ...

    @property
    def config(self) -> ConversationConfig: ...

    def ensure_out(self, fmt: InputFormat) -> None: ...

    def item_added(self, item: Item, previous_item_id: str | None) -> None: ...

    def item_done(self, item: Item, previous_item_id: str | None) -> None: ...

    def event_name(self, ga: str, beta: str) -> str: ...


class ResponseRounds:
    """Runs one conversation's responses (one at a time): each round's assistant turn, its message
    item, the MCP calls between rounds, and the ``.done`` events and ``response.done`` at the end."""

    def __init__(self, conversation: RoundsConversation) -> None:
        self.conversation = conversation  # its config and response are read and cleared here
        self.host = conversation.host
        self.settings = conversation.settings
        self.assistant = conversation.assistant
        self.items = conversation.items
        self.tools = conversation.tools
        self.audio = conversation.audio

    def _assistant_options(self, options: ResponseOptions) -> AssistantOptions:
        base = self.assistant.options
        return replace(
            base,
            system_prompt=options.instructions,
            speak=options.modality == "audio",
            voice=options.voice,
            model=self.conversation.config.llm_model or base.model,
            max_answer_tokens=options.max_tokens,
            temperature=options.llm_temperature,
            speed=options.speed,
            tools=options.tools,
        )

    async def _wait_for_transcripts(self) -> None:
        pending = self.items.pending()
        if not pending:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.assistant_turn_timeout_s):
                for item in pending:
                    await item.transcribed.wait()

    async def run(self, response: Response, speech_ended_at: float | None) -> None:
        """The response's rounds: one assistant turn each; a turn that calls MCP tools has them run
        here (``ToolItems.run_mcp``), and the next round answers with their results."""
        outcome: TurnOutcome | None = None
        round_closed = False
        try:
            if response.context is None:
                await self._wait_for_transcripts()
            await self.tools.ready()
            context = list(response.context if response.context is not None else self.items.context())
            if self.audio == "deltas" and response.options.modality == "audio":
                self.conversation.ensure_out(response.options.output_format)
            after_calls = False
            rounds = 0
            while True:
                rounds += 1
                round_closed = False
                self._open(response)
                options = self._assistant_options(response.options)
                options = replace(options, tools=self.tools.tools_for(response, after_calls=after_calls))
                response.turn = await self.assistant.respond(context, options, speech_ended_at=speech_ended_at)
                response.running_tools = False  # the new round's turn is what a cancel interrupts now
                outcome = await response.turn.outcome()
                calls = outcome.tool_calls if outcome.status == "completed" else ()
                mcp_calls = [(index, call) for index, call in enumerate(calls) if self.tools.is_mcp(call.name)]
                if not mcp_calls:
                    break
                self._close_round(response, outcome, "completed")
                round_closed = True
                # A call cut off or malformed goes into the history as one any backend renders ({}).
                written = tuple(replace(call, arguments=engine_arguments(call.arguments)) for call in calls)
                context.append(ChatMessage("assistant", outcome.text, written))
                response.running_tools = True
                cut = outcome.finish_reason == "length"
                for index, call in mcp_calls:
                    result = await self.tools.run_mcp(response, index, call, cut=cut)
                    context.append(ChatMessage("tool", result, tool_call_id=call.id))
                if len(mcp_calls) < len(calls):
                    break  # the client runs its functions, then asks for the next response
                if rounds > self.settings.mcp_max_calls_per_turn:
                    break  # a model that keeps calling MCP tools it is no longer offered cannot loop
                after_calls, speech_ended_at = True, None
        except asyncio.CancelledError:
            outcome = None  # cancelled before the turn began, during MCP calls, or the session is closing
        finally:
            self._finish(response, outcome, round_closed=round_closed)

    def _open(self, response: Response) -> None:
        """A round's message item (its text or audio answer)."""
        kind: ContentKind = "output_audio" if response.options.modality == "audio" else "output_text"
        item = Item(new_id("item"), "assistant", kind, "", status="in_progress", rate_hz=self._out_rate())
        response.item = item
        response.output.append(item)
        response.open_calls = {}
        self.host.send(
            "response.output_item.added",
            response_id=response.id,
            output_index=response.item_index,
            item=item.describe(beta=self.host.beta),
        )
        if response.options.in_conversation:
            self.conversation.item_added(item, self.items.add(item))
        part = {"type": "audio", "transcript": ""} if kind == "output_audio" else {"type": "text", "text": ""}
        self.host.send(
            "response.content_part.added",
            response_id=response.id,
            item_id=item.id,
            output_index=response.item_index,
            content_index=0,
            part=part,
        )

    def _out_rate(self) -> int:
        out = self.assistant.out
        return out.sample_rate_hz if out is not None else 24000

    def _close_round(self, response: Response, outcome: TurnOutcome | None, status: str) -> None:
        """Close a round's message item and the function calls its turn made (never awaits)."""
        item = response.item
        send = self.host.send
        ids = {"response_id": response.id}
        if item is not None:
            turn = response.turn
            item.text = (outcome.text if status in ("completed", "incomplete") else outcome.heard) if outcome else ""
            item.status = "completed" if status == "completed" else "incomplete"
            if turn is not None and item.kind == "output_audio":
                out = self.assistant.out
                taken = out.taken_samples if out is not None else turn.start_sample
                item.audio_samples = max(0, taken - turn.start_sample)
                item.marks = tuple(
                    replace(m, start=m.start - turn.start_sample, end=m.end - turn.start_sample) for m in turn.marks
                )
            part_ids = {**ids, "item_id": item.id, "output_index": response.item_index, "content_index": 0}
            text = item.text or ""
            if item.kind == "output_audio":
                send(self.conversation.event_name("response.output_audio.done", "response.audio.done"), **part_ids)
                send(
                    self.conversation.event_name(
                        "response.output_audio_transcript.done", "response.audio_transcript.done"
                    ),
                    **part_ids,
                    transcript=text,
                )
                part: dict[str, Any] = {"type": "audio", "transcript": text}
            else:
                send(
                    self.conversation.event_name("response.output_text.done", "response.text.done"),
                    **part_ids,
                    text=text,
                )
                part = {"type": "text", "text": text}
            send("response.content_part.done", **part_ids, part=part)
            described = item.describe(beta=self.host.beta)
            send("response.output_item.done", **ids, output_index=response.item_index, item=described)
            if response.options.in_conversation and item.id in self.items:
                self.conversation.item_done(item, self.items.previous_id(item.id))
            response.item = None
        calls = outcome.tool_calls if outcome is not None and status in ("completed", "incomplete") else ()
        cut = outcome is not None and outcome.finish_reason == "length"
        for index, call in enumerate(calls):
            if not self.tools.is_mcp(call.name):
                self.tools.function_done(response, index, call, cut=cut)

    def _finish(self, response: Response, outcome: TurnOutcome | None, *, round_closed: bool = False) -> None:
        """Close the response's parts and send ``response.done`` (never awaits)."""
        if self.conversation.response is response:
            self.conversation.response = None
        status, details = status_of(response, outcome)
        send = self.host.send
        ids = {"response_id": response.id}
        if not round_closed:
            self._close_round(response, outcome, status)
        for item in response.output:  # calls cut off by a cancel
            if item.type in ("function_call", "mcp_call") and item.status == "in_progress":
                item.status = "incomplete"
                if item.type == "mcp_call" and item.output is None and item.error is None:
                    item.error = {"type": "tool_execution_error", "message": "cancelled before it finished"}
                where = response.index_of(item)
                send("response.output_item.done", **ids, output_index=where, item=item.describe(beta=self.host.beta))
                if response.options.in_conversation and item.id in self.items:
                    self.conversation.item_done(item, self.items.previous_id(item.id))
        if self.audio == "track" and response.audio_started and status == "cancelled":
            send("output_audio_buffer.cleared", **ids)
        usage = outcome.usage if outcome is not None else None
        send("response.done", response=describe_response(response, status, details, usage, beta=self.host.beta))
        if self.audio == "track" and response.audio_started and status != "cancelled":
            send("output_audio_buffer.stopped", **ids)

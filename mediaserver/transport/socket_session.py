"""The shell every streaming WebSocket transport shares: reader, worker, writer and close.

A connection has three tasks. The reader (the request handler's ``run``) only reads: it validates
every message at once and queues work, so a message that waits for a transcript never stops the
socket from being read (heartbeats, disconnects and the idle deadline keep working while the model
runs). The worker applies the queued work in order to the session's ``StreamSession``. The writer
sends queued outgoing messages in order, so a slow client never blocks the worker and no caller
awaits a send (a cancelled caller cannot lose half of what it meant to say).

Everything is bounded: queued work (``max_queued_work`` messages, ``max_backlog_s`` of audio the
worker lags behind the socket) and queued outgoing messages (``max_outbox``; a client that does not
read is closed). ``aclose`` is idempotent and cancels everything before its first await, so however
a connection ends (client close, abrupt disconnect, idle deadline, oversize message, worker failure,
server shutdown) the session leaves the registry and no task outlives it. Every task carries the
session id in its name.

Subclasses keep only their wire format: ``on_text`` / ``on_binary`` (reader side), ``apply``
(worker side, for anything but audio, which goes to ``feed``), ``on_idle`` (the goodbye message) and
``close_streams``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from mediaserver.config import Settings
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray
from mediaserver.state import SESSIONS

log = logging.getLogger(__name__)

# Close codes: 1008/1009/1011/1013 are RFC 6455; 4408 (private range) mirrors HTTP 408.
CLOSE_IDLE_TIMEOUT: Final = 4408
MAX_CLOSE_REASON_BYTES: Final = 123
FLUSH_ON_CLOSE_S: Final = 1.0


def close_reason(text: str) -> bytes:
    """A close reason within RFC 6455's 123 bytes, never cutting a UTF-8 character in half."""
    return text.encode("utf-8")[:MAX_CLOSE_REASON_BYTES].decode("utf-8", "ignore").encode("utf-8")


class LimitedWebSocket(web.WebSocketResponse):
    """A ``WebSocketResponse`` that takes messages of up to ``max_message_bytes`` (that size
    included), and whose close for a larger one (1009) says what the limit is: aiohttp closes by
    itself with an empty reason, which leaves a client guessing.

    aiohttp refuses a message whose size *reaches* its ``max_msg_size``, so it gets one more byte.
    (A compressed message is refused only past it: the session's reader checks the limit again on
    the message itself, ``Limits.max_message_bytes``.)"""

    def __init__(self, *, max_message_bytes: int, **kwargs: Any) -> None:
        super().__init__(max_msg_size=max_message_bytes + 1, **kwargs)
        self.max_message_bytes = max_message_bytes

    async def close(self, *, code: int = WSCloseCode.OK, message: bytes = b"", drain: bool = True) -> bool:
        if code == WSCloseCode.MESSAGE_TOO_BIG and not message:
            message = close_reason(f"message too big: at most {self.max_message_bytes} bytes per message")
        return await super().close(code=code, message=message, drain=drain)


@dataclass(frozen=True)
class AudioWork:
    """Decoded audio for the worker to feed, in order with the other work."""

    samples: AudioArray = field(repr=False)


@dataclass(frozen=True)
class AudioGap:
    """The sender sent nothing for ``samples`` of audio (Opus DTX, a paused track), in order."""

    samples: int


@dataclass(frozen=True)
class ReleaseHeldAudio:
    """Hear the audio the echo canceller holds for ``auto``'s decision (``HeldRelease``), in order."""


class MessageSocket(Protocol):
    """What the shell needs of a connection: an aiohttp ``WebSocketResponse``, or a WebRTC data
    channel made to look like one (transport/openai/realtime/calls.py)."""

    @property
    def closed(self) -> bool: ...

    @property
    def prepared(self) -> bool: ...

    @property
    def close_code(self) -> int | None: ...

    async def receive(self) -> WSMessage: ...

    async def send_str(self, data: str, compress: int | None = None) -> None: ...

    async def send_bytes(self, data: bytes, compress: int | None = None) -> None: ...

    async def close(self, *, code: int = WSCloseCode.OK, message: bytes = b"", drain: bool = True) -> bool: ...


@dataclass(frozen=True)
class Limits:
    max_queued_work: int
    max_backlog_s: float
    max_outbox: int
    idle_timeout_s: float
    max_message_bytes: int = 0  # > 0: a larger message closes with 1009 (see LimitedWebSocket)


class SocketSession:
    """One streaming WebSocket connection: its reader, work queue and worker, outbox and writer."""

    kind = "socket"  # names tasks and log lines

    def __init__(
        self, app: web.Application, ws: MessageSocket, settings: Settings, session_id: str, limits: Limits
    ) -> None:
        self.id = session_id
        self.app = app
        self.ws = ws
        self.settings = settings
        self.sessions = app[SESSIONS]
        self.limits = limits
        self.last_activity = time.monotonic()
        self.opened_at = time.monotonic()
        self.backlog_samples = 0  # audio queued by the reader, not yet fed by the worker
        self._work: asyncio.Queue[Any] = asyncio.Queue(limits.max_queued_work)
        self._outbox: asyncio.Queue[str | bytes] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._overflowed = False
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    # --- what subclasses implement --------------------------------------------------------------

    async def on_text(self, data: str) -> None:
        """A text message from the client (reader side: validate and queue, never wait on the model)."""

    async def on_binary(self, data: bytes) -> None:
        """A binary message from the client."""

    async def feed(self, samples: AudioArray) -> None:
        """Queued audio, in order (worker side)."""

    async def apply(self, work: Any) -> None:
        """Queued work other than audio, in order (worker side)."""

    async def gap(self, samples: int) -> None:
        """A gap in the sender's audio (``AudioGap``), in order (worker side)."""

    def on_idle(self, idle_s: float) -> None:
        """The idle deadline passed: say goodbye in the wire format (the shell then closes)."""

    def on_worker_failed(self) -> None:
        """The worker raised: tell the client (the shell then closes with 1011)."""

    async def close_streams(self) -> None:
        """Close what the subclass owns (its StreamSessions); called once from ``aclose``."""

    def summary(self) -> str:
        """What the closing log line adds (utterances, audio)."""
        return ""

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._writer = loop.create_task(self._write(), name=f"{self.kind}-writer-{self.id}")
        self._worker = loop.create_task(self._run_worker(), name=f"{self.kind}-worker-{self.id}")

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A task owned by the session: cancelled by ``aclose``, its name carrying the session id."""
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self, code: int = WSCloseCode.GOING_AWAY, reason: str = "session closed by the server") -> None:
        """Idempotent. Everything is cancelled before the first await, so even an interrupted close
        leaves no task running and no registry entry behind."""
        if self._closed:
            return
        self._closed = True
        self.sessions.discard(self.id)
        current = asyncio.current_task()
        others = [t for t in (self._worker, *self._tasks) if t is not None and t is not current]
        for task in others:
            task.cancel()
        try:
            await self.close_streams()
            for task in others:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self.ws.prepared and not self.ws.closed and self._writer is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FLUSH_ON_CLOSE_S):
                        await self._outbox.join()
        finally:
            if self._writer is not None and self._writer is not current:
                self._writer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._writer
            # The code of whoever closed first: after the server's close, ``ws.close_code`` is the
            # client's reply (1000 from most clients), not what the server said.
            closed_with = self.ws.close_code
            if self.ws.prepared and not self.ws.closed:
                await self.ws.close(code=code, message=close_reason(reason))
                closed_with = code
            extra = self.summary()
            log.info(
                "%s session %s: closed after %.1f s (code %s)%s",
                self.kind,
                self.id,
                time.monotonic() - self.opened_at,
                closed_with,
                f", {extra}" if extra else "",
            )

    # --- sending --------------------------------------------------------------------------------

    def send_json(self, payload: dict[str, Any]) -> None:
        self.send_raw(json.dumps(payload))

    def send_raw(self, message: str | bytes) -> None:
        """Queue a message; never awaits. A client that stops reading is closed, not buffered forever."""
        if self._closed:
            return
        if self._outbox.qsize() >= self.limits.max_outbox:
            if not self._overflowed:
                self._overflowed = True
                log.warning("%s session %s: client does not read its messages; closing", self.kind, self.id)
                self.spawn(self.aclose(WSCloseCode.POLICY_VIOLATION, "client too slow"), f"{self.kind}-close")
            return
        self._outbox.put_nowait(message)

    async def _write(self) -> None:
        while True:
            message = await self._outbox.get()
            try:
                if not self.ws.closed:
                    if isinstance(message, bytes):
                        await self.ws.send_bytes(message)
                    else:
                        await self.ws.send_str(message)
            except (ConnectionError, RuntimeError):
                log.debug("%s session %s: connection gone while sending", self.kind, self.id)
            finally:
                self._outbox.task_done()

    # --- reading --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Read until the socket closes (or the idle deadline closes it)."""
        idle_s = self.limits.idle_timeout_s
        while not self.ws.closed:
            try:
                # Our own deadline: aiohttp's receive(timeout=) restarts on every heartbeat pong.
                async with asyncio.timeout(self._idle_left(idle_s)):
                    msg = await self.ws.receive()
            except TimeoutError:
                if self._idle_left(idle_s) > 0:
                    continue
                log.info("%s session %s: idle for %.0f s, closing", self.kind, self.id, idle_s)
                self.on_idle(idle_s)
                await self.aclose(CLOSE_IDLE_TIMEOUT, "idle timeout")
                return
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY) and self._too_big(msg.data):
                await self.aclose(WSCloseCode.MESSAGE_TOO_BIG, "message too big")
                return
            if msg.type == WSMsgType.TEXT:
                self.last_activity = time.monotonic()
                await self.on_text(msg.data)
            elif msg.type == WSMsgType.BINARY:
                self.last_activity = time.monotonic()
                await self.on_binary(msg.data)
            elif msg.type == WSMsgType.ERROR:
                log.info(
                    "%s session %s: closed on error (code %s): %s", self.kind, self.id, self.ws.close_code, msg.data
                )
                return
            else:  # CLOSE, CLOSING, CLOSED
                return

    def _too_big(self, data: str | bytes) -> bool:
        limit = self.limits.max_message_bytes
        if limit <= 0 or len(data) <= limit // 4:  # a str holds at least a byte per character
            return False
        size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8"))
        if size > limit:
            log.info("%s session %s: a message of %d bytes exceeds %d, closing", self.kind, self.id, size, limit)
            return True
        return False

    def _idle_left(self, idle_s: float) -> float:
        return self.last_activity + idle_s - time.monotonic()

    # --- work -----------------------------------------------------------------------------------

    def enqueue(self, work: Any) -> bool:
        """Queue work for the worker; False when the queue is full."""
        try:
            self._work.put_nowait(work)
        except asyncio.QueueFull:
            return False
        return True

    def enqueue_audio(self, samples: AudioArray) -> bool:
        """Queue decoded audio; False (and nothing queued) when the worker is too far behind."""
        if self.backlog_samples + samples.size > self.limits.max_backlog_s * SAMPLE_RATE_HZ:
            return False
        if not self.enqueue(AudioWork(samples)):
            return False
        self.backlog_samples += samples.size
        self.on_audio_queued()
        return True

    async def release_held_audio(self) -> None:
        """Hear what the face's echo canceller holds for its decision (faces with one override it)."""

    def release_later(self) -> None:
        """Have the worker hear the held audio in its turn (``HeldRelease``: the sender went quiet)."""
        self.enqueue(ReleaseHeldAudio())

    def on_audio_queued(self) -> None:
        """Audio arrived and waits for the worker (a face tells its stream: not a gap in the audio)."""

    def backlog_s_after(self, extra_s: float) -> float:
        """Seconds of audio the worker would lag behind after ``extra_s`` more."""
        return self.backlog_samples / SAMPLE_RATE_HZ + extra_s

    async def _run_worker(self) -> None:
        try:
            while True:
                work = await self._work.get()
                if isinstance(work, AudioWork):
                    self.backlog_samples -= work.samples.size
                    await self.feed(work.samples)
                elif isinstance(work, ReleaseHeldAudio):
                    await self.release_held_audio()
                elif isinstance(work, AudioGap):
                    await self.gap(work.samples)
                else:
                    await self.apply(work)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s session %s: worker failed", self.kind, self.id)
            self.on_worker_failed()
            self.spawn(self.aclose(WSCloseCode.INTERNAL_ERROR, "internal error"), f"{self.kind}-close")

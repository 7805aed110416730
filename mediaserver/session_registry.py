"""The registry of open streaming sessions (WebRTC, device WebSocket, Realtime): a cap
(``max_sessions``, a 503 ``too_many_sessions`` past it), idle reaping (``session_idle_timeout_s``) and
close-all on shutdown (aiohttp's ``on_shutdown``, before the server waits for its handlers). It
holds any session with a last-activity time and an idempotent close."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from mediaserver.config import Settings
from mediaserver.errors import ApiError
from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)


class SessionLimitReached(ApiError):
    status = 503
    code = "too_many_sessions"
    retryable = True


class ShuttingDown(SessionLimitReached):
    """A session asked for while the server shuts down (a subclass: every face that refuses a session
    over the cap refuses this one the same way)."""

    code = "shutting_down"


class SessionRegistry:
    """All open streaming sessions of the app: a cap, idle reaping and close-all on shutdown."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self._metrics = metrics
        self._sessions: dict[str, Closable] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._sessions)

    def ids(self) -> list[str]:
        return list(self._sessions)

    def get(self, session_id: str) -> Closable | None:
        return self._sessions.get(session_id)

    def add(self, session_id: str, session: Closable) -> None:
        if self._closed:
            raise ShuttingDown("the server is shutting down; connect again in a moment")
        if len(self._sessions) >= self.settings.max_sessions:
            raise SessionLimitReached(f"too many open sessions (max_sessions={self.settings.max_sessions})")
        self._sessions[session_id] = session
        self._update_gauge()
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="session-reaper")

    def discard(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._update_gauge()

    def _update_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.sessions.set(len(self._sessions))

    async def _reap(self) -> None:
        period_s = min(60.0, self.settings.session_idle_timeout_s / 4)
        while True:
            await asyncio.sleep(period_s)
            now = time.monotonic()
            for session_id, session in list(self._sessions.items()):
                if now - session.last_activity > self.settings.session_idle_timeout_s:
                    log.info("closing idle session %s", session_id)
                    self.discard(session_id)
                    await session.aclose()

    async def aclose(self) -> None:
        """Close every open session at once (each closes its socket with 1001 "going away", or its
        peer connection) and take no new ones: the server is shutting down."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        sessions = list(self._sessions.values())
        self._sessions.clear()
        self._update_gauge()
        if sessions:
            log.info("closing %d open session(s)", len(sessions))
        results = await asyncio.gather(*(session.aclose() for session in sessions), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.warning("a session failed to close cleanly: %r", result)


class Closable(Protocol):
    """What the registry needs of a session: its last activity time and an idempotent close."""

    @property
    def last_activity(self) -> float: ...

    async def aclose(self) -> None: ...

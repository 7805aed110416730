"""Events said from synchronous code, in order: an answer's pause and resume (``Assistant.pause``,
called while the session judges speech over the answer, cannot await its emit).

Each goes out after the one before it. They are not the assistant's helper tasks: a cut cancels
those, and a pause said before the cut must still go out before its ``assistant_audio_stopped``
(``said`` waits for them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from mediaserver.events import SessionEvent


class Notices:
    def __init__(self, emit: Callable[[SessionEvent], Awaitable[None]], name: str) -> None:
        self._emit = emit
        self._name = name
        self._latest: asyncio.Task[None] | None = None

    def say(self, event: SessionEvent) -> None:
        """Emit ``event`` once the events said before it have gone out."""
        before = self._latest

        async def say() -> None:
            if before is not None:
                await asyncio.wait({before})  # (its outcome is its own; a cancel of this one stops here)
            await self._emit(event)

        task = asyncio.get_running_loop().create_task(say(), name=f"notice-{type(event).__name__}-{self._name}")
        task.add_done_callback(lambda done: done.cancelled() or done.exception())  # (retrieved: never logged)
        self._latest = task

    async def said(self) -> None:
        """Until the events said so far have gone out."""
        if self._latest is not None:
            await asyncio.wait({self._latest})

    def cancel(self) -> None:
        """Say nothing more (the ones before the latest are short, and end by themselves)."""
        latest, self._latest = self._latest, None
        if latest is not None:
            latest.cancel()

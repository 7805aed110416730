"""Who speaks the voice-loop turn whose tools run in this task (docs/speakers.md).

The assistant sets it for each turn's task from the speaker the session identified; MCP calls
carry it in their request ``_meta`` under ``MCP_META_KEY``, and the tool-call events the client
sees carry it as ``speaker``. None: nobody is enrolled, or no enrolled voice matched.
"""

from __future__ import annotations

from contextvars import ContextVar

current_speaker: ContextVar[str | None] = ContextVar("current_speaker", default=None)
MCP_META_KEY = "mediaserver/speaker"

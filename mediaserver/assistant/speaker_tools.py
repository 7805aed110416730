"""Tools only some speakers may use (``speaker_tools``): "only alice may unlock the door".

The voice loop knows who speaks each turn (mediaserver/stream/speaker.py). A tool named in
``speaker_tools`` is offered to the model only on a turn spoken by one of its speakers, never on a
turn of an unknown voice; a call to it on any other turn (a model may call a tool it was not
offered) is refused with an error result the model reads. Tools not named are everyone's.
Speaker recognition is a convenience, not authentication (docs/speakers.md): this keeps a tool
out of casual reach, it is not a lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mediaserver.assistant.mcp import ToolResult
from mediaserver.assistant.tool_rounds import Toolbox
from mediaserver.llm.tools import ToolCall, ToolSpec


class SpeakerGate:
    """``toolbox`` as the speaker of this turn may use it (a ``Toolbox``)."""

    def __init__(self, toolbox: Toolbox, allowed: Mapping[str, Sequence[str]], speaker: str | None) -> None:
        self.toolbox = toolbox
        self.allowed = allowed
        self.speaker = speaker

    def permits(self, name: str) -> bool:
        speakers = self.allowed.get(name)
        return speakers is None or (self.speaker is not None and self.speaker in speakers)

    @property
    def tool_choice(self) -> tuple[str, bool] | None:
        return self.toolbox.tool_choice

    def tools(self) -> list[ToolSpec]:
        return [tool for tool in self.toolbox.tools() if self.permits(tool.name)]

    def client_side(self, name: str) -> bool:
        return self.toolbox.client_side(name)

    async def run(self, call: ToolCall, refuse: str | None = None) -> ToolResult:
        if refuse is None and not self.permits(call.name):
            who = self.speaker or "a voice no enrolled speaker matched"
            return ToolResult(f"{call.name} may not be used by {who} (speaker_tools)", is_error=True)
        return await self.toolbox.run(call, refuse)


def gated(toolbox: Toolbox | None, allowed: Mapping[str, Sequence[str]], speaker: str | None) -> Toolbox | None:
    """The toolbox for a turn of ``speaker``: ``toolbox`` itself when no tool is restricted."""
    if toolbox is None or not allowed:
        return toolbox
    return SpeakerGate(toolbox, allowed, speaker)

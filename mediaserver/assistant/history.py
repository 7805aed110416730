"""The voice loop's conversation, as the assistant keeps it (``Assistant.history``).

The messages, and one thing more: the user's words left unanswered because they spoke on right
after them. Semantic turns end a turn at a pause; when the rest of the sentence follows within
``assistant_rejoin_ms`` and none of the answer was heard, the next turn joins those words into one
user message (docs/turns.md).
"""

from __future__ import annotations

import time

from mediaserver.llm.types import ChatMessage


class History:
    """One voice-loop conversation: ``messages`` (user and assistant, in order) and the unanswered
    words the next turn joins."""

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        # The user's last words, unanswered because they spoke on right after them, and who said
        # them: the next turn joins them (``rejoined``).
        self._unanswered: tuple[ChatMessage, str | None] | None = None
        self._recorded_at = 0.0  # when the last turn's words went into the history

    def clear(self) -> None:
        self.messages.clear()
        self._unanswered = None

    def rejoined(self, user_text: str, speaker: str | None, max_chars: int) -> tuple[list[ChatMessage], str]:
        """The history before the new turn, and the turn's text: joined to the user's last words when
        they are still unanswered because ``speaker`` spoke on right after them (``spoke_on``), unless
        the joined text would pass ``max_chars`` (never a runaway message)."""
        mark = self._unanswered
        if mark is not None and self.messages and self.messages[-1] is mark[0] and mark[1] == speaker:
            joined = f"{mark[0].content.rstrip()} {user_text.lstrip()}"
            if len(joined) <= max_chars:
                return self.messages[:-1], joined
        return list(self.messages), user_text

    def record_user(self, user_text: str, speaker: str | None, max_chars: int) -> None:
        """The new turn goes into the history (joined to the user's unanswered words, ``rejoined``)."""
        self.messages[:], text = self.rejoined(user_text, speaker, max_chars)
        self._unanswered = None
        self.messages.append(ChatMessage("user", text))
        self._recorded_at = time.monotonic()

    def spoke_on(self, *, recorded: bool, heard: str, speaker: str | None, window_s: float) -> None:
        """A turn was interrupted: if it is in this history (``recorded``), none of it was ``heard``
        and it began within ``window_s`` of its words (the user spoke on right after them: a turn
        ended at a pause mid-sentence), its words wait to be joined to the next turn's."""
        self._unanswered = None
        if not recorded or heard.strip() or not self.messages or self.messages[-1].role != "user":
            return
        if window_s > 0 and time.monotonic() - self._recorded_at <= window_s:
            self._unanswered = (self.messages[-1], speaker)

    def remember(self, answer: str) -> None:
        """What the user heard of an answer (nothing heard: nothing recorded)."""
        if answer.strip():
            self.messages.append(ChatMessage("assistant", answer.strip()))

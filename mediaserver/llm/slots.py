"""Which llama-server slot a generation runs in: a conversation goes back to the slot that holds it.

llama-server keeps each slot's last prompt and answer in its KV cache, so a conversation's next turn
evaluates only what is new, if it lands in the same slot. Left to itself, llama-server picks the
slot whose cached prompt shares the longest prefix; with one system prompt for every conversation,
a new conversation then takes over another one's slot (measured: a second conversation's first
turn evicted the first one's history, whose next turn got 24 of 32 prompt tokens from the cache
instead of all of them). So the service picks: every request names its slot (``id_slot``).

A conversation is known by its start, the messages up to and including the first user message:
a client that resends the history (the voice loop, any OpenAI chat client) sends the same start
every turn. A request goes to its conversation's slot when that is free, else to the free slot
used longest ago (so the conversations active most recently keep their caches). The service's
queue admits at most as many generations as there are slots, so a free slot always exists.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence

from mediaserver.llm.types import ChatMessage

MAX_CONVERSATIONS = 4096  # remembered conversation → slot entries (LRU)


def conversation_key(messages: Sequence[ChatMessage]) -> str:
    digest = hashlib.sha256()
    for message in messages:
        digest.update(f"{message.role}\0{message.content}\0".encode())
        if message.role == "user":
            break
    return digest.hexdigest()


class SlotAffinity:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._busy: set[int] = set()
        self._used_at = [0.0] * slots
        self._slot_of: OrderedDict[str, int] = OrderedDict()

    def take(self, messages: Sequence[ChatMessage]) -> int:
        """The slot for this request, now marked busy (``give`` it back when the generation ends)."""
        free = [slot for slot in range(self.slots) if slot not in self._busy]
        if not free:  # more generations than slots: cannot happen behind the service's queue
            raise RuntimeError("no free llama-server slot")
        key = conversation_key(messages)
        slot = self._slot_of.get(key)
        if slot is None or slot in self._busy:
            slot = min(free, key=lambda s: self._used_at[s])
        self._busy.add(slot)
        self._used_at[slot] = time.monotonic()
        self._slot_of[key] = slot
        self._slot_of.move_to_end(key)
        while len(self._slot_of) > MAX_CONVERSATIONS:
            self._slot_of.popitem(last=False)
        return slot

    def give(self, slot: int) -> None:
        self._busy.discard(slot)

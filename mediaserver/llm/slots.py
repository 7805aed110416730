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

A history trimmed to its budget (the voice loop past ``assistant_history_turns``) starts with
another user message every turn: its start is new, yet the slot that served it last holds the rest
of it. So a request with an unknown start goes to the free slot whose last prompt shared the most
of its user and assistant messages (``MIN_SHARED_MESSAGES`` at least), where llama-server reuses
the moved runs of its cache (``llm_engine_cache_reuse_tokens``, ``--cache-reuse``). Measured
(bench_voice_loop.py, 12 turns): without it, every turn from the tenth took 3.9-5.4 s to its first
token against 0.3 s before.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence

from mediaserver.llm.types import ChatMessage

MAX_CONVERSATIONS = 4096  # remembered conversation → slot entries (LRU)
MIN_SHARED_MESSAGES = 2  # a trimmed history finds its slot by at least this many messages in common


def _message_keys(messages: Sequence[ChatMessage]) -> frozenset[str]:
    """The user and assistant messages (the system prompt is everyone's), hashed."""
    return frozenset(
        hashlib.sha256(f"{m.role}\0{m.content}".encode()).hexdigest() for m in messages if m.role != "system"
    )


def _in_order(messages: Sequence[ChatMessage]) -> tuple[str, ...]:
    """Every message, hashed, in order (a prefill's prompt is a prefix of its request's)."""
    return tuple(hashlib.sha256(f"{m.role}\0{m.content}".encode()).hexdigest() for m in messages)


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
        self._held: list[frozenset[str]] = [frozenset()] * slots  # each slot's last prompt's messages
        # Prefills under way (``prefilling``): slot → the prefilled messages, hashed in order.
        self._prefilling: dict[int, tuple[str, ...]] = {}

    def take(self, messages: Sequence[ChatMessage]) -> int:
        """The slot for this request, now marked busy (``give`` it back when the generation ends).
        A request whose prompt begins with a prefill still being evaluated goes to that prefill's
        slot (llama-server runs it once the prefill is done, on its cache): elsewhere it would
        evaluate the same prompt beside it, both at half speed (a fault trial: after an engine
        restart, a voice-loop session's system prompt and tools, ~950 tokens, were evaluated on
        two slots at once, and the first answer took 9-13 s)."""
        key, held = conversation_key(messages), _message_keys(messages)
        # (Only for a conversation with no slot of its own yet: a system prompt's prefill is a prefix
        # of every conversation on those settings, and one begun goes back to its own cache.)
        known = key in self._slot_of or self._holding(held, list(range(self.slots))) is not None
        slot = None if known else self._prefilled(messages)
        if slot is None:
            slot = self._pick(key, held)
        if slot is None:  # more generations than slots: cannot happen behind the service's queue
            raise RuntimeError("no free llama-server slot")
        self._held[slot] = held
        self._busy.add(slot)
        self._used_at[slot] = time.monotonic()
        self._slot_of[key] = slot
        self._slot_of.move_to_end(key)
        while len(self._slot_of) > MAX_CONVERSATIONS:
            self._slot_of.popitem(last=False)
        return slot

    def peek(self, messages: Sequence[ChatMessage], *, own: bool = False) -> int | None:
        """The slot ``take`` would give this request now, not marked busy or used (None: every slot
        is busy): a prefill (``LlamaServerEngine.prefill``) puts its prompt where the request will
        go: a new conversation's system prompt in the free slot used longest ago, a question still
        being spoken in its conversation's slot. ``own``: only the conversation's own slot, free (a
        conversation not begun yet: where ``take`` puts it), else None: where ``take`` would fall
        back to the slot used longest ago, a prefill would evict another conversation for nothing."""
        begun = any(m.role == "assistant" for m in messages)
        return self._pick(conversation_key(messages), _message_keys(messages), own=own, begun=begun)

    def _pick(self, key: str, held: frozenset[str], *, own: bool = False, begun: bool = False) -> int | None:
        """``take``'s choice (``peek``'s with ``own``) for a conversation known by ``key`` holding the
        messages ``held``; ``begun``: it has answers already (no slot of its own: nowhere to prefill)."""
        free = [slot for slot in range(self.slots) if slot not in self._busy]
        if not free:
            return None
        slot = self._slot_of.get(key)
        if slot is None:
            slot = self._holding(held, free)
        if own and (slot in self._busy or (slot is None and begun)):
            return None
        if slot is None or slot in self._busy:
            slot = self._coldest(free)
        return slot

    def prefilling(self, slot: int, messages: Sequence[ChatMessage]) -> None:
        """A prefill of ``messages`` is being evaluated in ``slot`` (until ``prefilled``)."""
        self._prefilling[slot] = _in_order(messages)

    def prefilled(self, slot: int) -> None:
        self._prefilling.pop(slot, None)

    def _prefilled(self, messages: Sequence[ChatMessage]) -> int | None:
        """The free slot evaluating a prefill that this request's messages begin with, if any."""
        if not self._prefilling:
            return None
        sequence = _in_order(messages)
        for slot, prefix in self._prefilling.items():
            if slot not in self._busy and sequence[: len(prefix)] == prefix:
                return slot
        return None

    def _coldest(self, free: list[int]) -> int:
        """The free slot used longest ago, one evaluating a prefill last (its session's turn is next)."""
        return min(free, key=lambda s: (s in self._prefilling, self._used_at[s]))

    def _holding(self, held: frozenset[str], free: list[int]) -> int | None:
        """The free slot whose last prompt shared the most of these messages (a trimmed history)."""
        shared, slot = max(((len(held & self._held[s]), s) for s in free), default=(0, None))
        return slot if shared >= MIN_SHARED_MESSAGES else None

    def give(self, slot: int) -> None:
        self._busy.discard(slot)

"""Which llama-server slot a request goes to: its conversation's, while that slot is free."""

from __future__ import annotations

from mediaserver.llm.slots import SlotAffinity
from mediaserver.llm.types import ChatMessage

SYSTEM = ChatMessage("system", "Be brief.")


def conversation(name: str, turns: int) -> list[ChatMessage]:
    messages = [SYSTEM]
    for turn in range(turns):
        messages += [ChatMessage("user", f"{name} question {turn}"), ChatMessage("assistant", f"answer {turn}")]
    return messages[:-1]  # ends with the new question


def test_a_conversation_returns_to_its_slot_while_others_come_and_go() -> None:
    slots = SlotAffinity(4)
    a = slots.take(conversation("a", 1))
    slots.give(a)
    b = slots.take(conversation("b", 1))  # same system prompt, another conversation: another slot
    slots.give(b)
    assert b != a
    assert slots.take(conversation("a", 2)) == a  # the next turn of a: its own slot again
    slots.give(a)
    assert slots.take(conversation("b", 3)) == b


def test_a_busy_slot_sends_the_request_to_the_free_slot_used_longest_ago() -> None:
    slots = SlotAffinity(3)
    first = slots.take(conversation("a", 1))
    second = slots.take(conversation("b", 1))
    slots.give(second)
    # a's slot is busy (a second request of the same conversation): the never-used slot, not b's.
    other = slots.take(conversation("a", 1))
    assert other not in (first, second)
    assert sorted([first, second, other]) == [0, 1, 2]


def test_a_history_trimmed_to_its_budget_keeps_its_slot() -> None:
    """Past assistant_history_turns the voice loop drops the oldest turn, so the conversation's start
    changes every turn: it still goes back to the slot that holds the rest of it, not to the one used
    longest ago."""
    slots = SlotAffinity(4)  # (one never used: the slot a new conversation gets)
    full = conversation("a", 9)
    a = slots.take(full)
    slots.give(a)
    for other in ("b", "c"):  # other conversations use the other slots meanwhile
        slots.give(slots.take(conversation(other, 1)))
    trimmed = [SYSTEM, *full[3:], ChatMessage("assistant", "answer 8"), ChatMessage("user", "a question 9")]
    assert slots.take(trimmed) == a
    slots.give(a)
    # One message in common (the same everyday question in another conversation) is not enough.
    stranger = [SYSTEM, ChatMessage("user", "x question 0"), ChatMessage("assistant", "answer 0"), full[-1]]
    assert slots.take(stranger) != a


def test_a_prefill_goes_where_its_request_will_and_marks_nothing() -> None:
    """``peek`` (the slot ``LlamaServerEngine.prefill`` fills) is the slot ``take`` gives the same
    messages next: a system prompt alone goes where the next new conversation will, a question
    still being spoken to its conversation's slot; asking neither reserves nor ages a slot."""
    slots = SlotAffinity(3)
    a = slots.take(conversation("a", 1))
    slots.give(a)
    ahead = slots.peek([SYSTEM])
    assert ahead is not None and ahead != a and slots.peek([SYSTEM]) == ahead
    assert slots.peek(conversation("a", 2)) == a  # a's next question, while it is spoken
    assert slots.take(conversation("b", 1)) == ahead
    busy = [ahead, slots.take(conversation("c", 1)), slots.take(conversation("d", 1))]
    assert sorted(busy) == [0, 1, 2] and slots.peek([SYSTEM]) is None  # every slot busy: no prefill
    assert slots.peek(conversation("a", 2)) is None


def test_a_question_prefill_goes_only_to_its_conversations_own_free_slot() -> None:
    """``own`` (a question still being spoken): its conversation's slot while free, a new
    conversation's where ``take`` will put it, and nowhere when its own slot is busy (the slot used
    longest ago holds another conversation, which a prefill would evict for nothing)."""
    slots = SlotAffinity(3)
    a = slots.take(conversation("a", 1))
    slots.give(a)
    assert slots.peek(conversation("a", 2), own=True) == a
    new = slots.peek(conversation("b", 1), own=True)  # b's first question: the coldest slot
    assert new is not None and new != a and new == slots.peek(conversation("b", 1))
    busy = slots.take(conversation("a", 1))  # a's slot busy (its answer runs)
    assert busy == a and slots.peek(conversation("a", 2), own=True) is None
    assert slots.peek(conversation("a", 2)) not in (None, a)  # (take would fall back: a request must run)
    stranger = [SYSTEM, ChatMessage("user", "z question 0"), ChatMessage("assistant", "x"), ChatMessage("user", "y")]
    assert slots.peek(stranger, own=True) is None  # a history no slot holds: nothing to extend


def test_a_request_that_begins_with_a_prefill_under_way_goes_to_its_slot() -> None:
    """A session's system prompt is being prefilled in a slot when its first turn comes: the turn
    goes there (llama-server runs it once the prefill is done, on its cache), not to a colder slot
    that would evaluate the same prompt beside it (a fault trial: 9-13 s to a first answer after an
    engine restart); and another conversation keeps off that slot while another is free."""
    tools = [SYSTEM, ChatMessage("system", "Tools: lights.")]
    first_turn = [*tools, ChatMessage("user", "Lights on.")]
    slots = SlotAffinity(3)
    recent = slots.take(conversation("a", 1))  # slot 0, used just now
    slots.give(recent)
    slots.prefilling(recent, tools)  # (the prefill went where the session's last request was)
    assert slots.take(first_turn) == recent  # not the never-used slots 1 and 2
    slots.give(recent)
    slots.prefilled(recent)
    prefill = slots.peek(tools)
    assert prefill is not None and prefill != recent
    slots.prefilling(prefill, tools)
    other = slots.take(conversation("b", 1))  # the coldest free slot would be the prefill's
    assert other not in (prefill, recent), other
    slots.give(other)
    slots.prefilled(prefill)
    assert slots.take(conversation("c", 1)) == prefill  # done: the slot is anyone's again


def test_a_begun_conversation_goes_back_to_its_own_slot_past_another_sessions_prefill() -> None:
    """A system prompt's prefill is a prefix of every conversation on the same settings: a
    conversation already begun goes back to its own slot (its cached history), not to the slot
    where another session's system prompt is being prefilled (a review: it was pulled there, lost
    its cache and overwrote the other's prefill)."""
    slots = SlotAffinity(3)
    a_first = slots.take([SYSTEM, ChatMessage("user", "a question 0")])
    slots.give(a_first)
    prefill = slots.peek([SYSTEM])
    assert prefill is not None and prefill != a_first
    slots.prefilling(prefill, [SYSTEM])
    a_next = [
        SYSTEM,
        ChatMessage("user", "a question 0"),
        ChatMessage("assistant", "answer"),
        ChatMessage("user", "more"),
    ]
    assert slots.take(a_next) == a_first

"""HeldWords (stream/answering.py): a final the user spoke on over waits for the next one."""

from __future__ import annotations

from mediaserver.stream.answering import HeldWords


class Answers:
    """An answerer that records what it is asked, and who it was told speaks."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str | None, float | None]] = []
        self.speaker: str | None = None

    async def answer(self, user_text: str, *, speech_ended_at: float | None = None) -> None:
        self.asked.append((user_text, self.speaker, speech_ended_at))

    async def interrupt(self) -> bool:
        return False

    def observe_transcript(self, seconds: float) -> None:
        pass

    def heard_speaker(self, name: str | None) -> None:
        self.speaker = name


async def test_the_same_speakers_words_join_and_are_answered_once() -> None:
    held, answers = HeldWords("s1"), Answers()
    await held.answer(answers, "When the keeper walked along the shore,", 1.0, None, hold=True)
    assert held.pending and answers.asked == []
    await held.answer(answers, " which birds followed him?", 2.0, None, hold=False)
    assert answers.asked == [("When the keeper walked along the shore, which birds followed him?", None, 2.0)]
    assert not held.pending


async def test_they_go_on_joining_while_the_user_speaks_on() -> None:
    held, answers = HeldWords("s1"), Answers()
    for text in ("one,", "two,", "three."):
        await held.answer(answers, text, 1.0, "ann", hold=True)
    assert answers.asked == []
    await held.release(answers)
    assert [a[0] for a in answers.asked] == ["one, two, three."]


async def test_another_speakers_words_are_answered_first_and_as_theirs() -> None:
    held, answers = HeldWords("s1"), Answers()
    await held.answer(answers, "Is it raining?", 1.0, "ann", identified=True, hold=True)
    await held.answer(answers, "Turn on the lights.", 2.0, "bob", identified=True)
    assert answers.asked == [("Is it raining?", "ann", 1.0), ("Turn on the lights.", "bob", 2.0)]


async def test_release_without_held_words_answers_nothing() -> None:
    held, answers = HeldWords("s1"), Answers()
    await held.release(answers)
    assert answers.asked == [] and not held.pending


async def test_nothing_is_answered_while_the_user_speaks_on_whoever_spoke() -> None:
    held, answers = HeldWords("s1"), Answers()
    await held.answer(answers, "Is it raining?", 1.0, "ann", identified=True, hold=True)
    await held.answer(answers, "Turn on the lights.", 2.0, "bob", identified=True, hold=True)
    assert answers.asked == [] and held.pending
    await held.release(answers)
    assert answers.asked == [("Is it raining?", "ann", 1.0), ("Turn on the lights.", "bob", 2.0)]


async def test_an_unknown_speakers_words_after_a_known_ones_are_answered_as_nobodys() -> None:
    held, answers = HeldWords("s1"), Answers()
    await held.answer(answers, "Is it raining?", 1.0, "ann", identified=True, hold=True)
    await held.answer(answers, "Turn on the lights.", 2.0, None, identified=True)  # not enrolled
    assert answers.asked == [("Is it raining?", "ann", 1.0), ("Turn on the lights.", None, 2.0)]

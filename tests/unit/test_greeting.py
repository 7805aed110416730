"""The first answer to an enrolled speaker says their name (assistant/greeting.py, assistant_greeting)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mediaserver.assistant.greeting import Greeting, names
from mediaserver.config import Settings
from tests.unit.test_assistant import assistant


def run(greeting: Greeting, deltas: list[str]) -> str:
    return "".join(greeting.push(delta) for delta in deltas) + greeting.end()


def test_an_answer_that_does_not_name_the_speaker_gets_the_greeting_before_it() -> None:
    greeting = Greeting("alice", "Hi {name}.", 4)
    assert greeting.push("The capital") == ""  # held: its first words decide
    assert greeting.push(" of France is Paris.") == "Hi alice. The capital of France is Paris."
    assert greeting.push(" It is big.") == " It is big."  # decided: the rest goes on as it comes
    assert greeting.greeted


def test_an_answer_that_names_the_speaker_goes_out_as_written() -> None:
    for deltas in (["Hello", " Alice", "!", " How can I help?"], ["Sure, alice, the", " lights are on."]):
        greeting = Greeting("alice", "Hi {name}.", 4)
        assert run(greeting, deltas) == "".join(deltas)
        assert not greeting.greeted


def test_the_first_clause_decides_without_a_sentence_end() -> None:
    greeting = Greeting("bob", "Hi {name}.", 4)
    out = [greeting.push(d) for d in ["Well", " I", " think", " that", " it", " rains"]]
    assert out[:4] == ["", "", "", ""] and out[4] == "Hi bob. Well I think that it" and out[5] == " rains"


def test_a_short_answer_is_decided_at_its_end_and_an_empty_one_gets_nothing() -> None:
    assert run(Greeting("bob", "Hi {name}.", 4), ["Yes"]) == "Hi bob. Yes"
    assert run(Greeting("bob", "Hi {name}.", 4), []) == ""


def test_another_greeting_and_the_name_as_a_word_only() -> None:
    greeting = Greeting("Al", "Welcome back, {name}!", 4)
    assert run(greeting, ["Also, it is sunny."]) == "Welcome back, Al! Also, it is sunny."  # "Also" is not "Al"
    assert names("Hi, Al.", "Al") and not names("Also", "Al")


def test_who_is_greeted_and_when() -> None:
    helper = assistant()
    assert helper._greeting_due() is None  # nobody enrolled spoke
    helper.heard_speaker("alice")
    assert helper._greeting_due() == "alice"
    helper._greeted.answering("alice")  # (an answer to alice started)
    assert helper._greeting_due() is None
    helper.heard_speaker(None)  # an unknown voice between: alice is not greeted again
    helper.heard_speaker("alice")
    assert helper._greeting_due() is None
    helper.heard_speaker("bob")  # another enrolled speaker: bob now, alice again after him
    assert helper._greeting_due() == "bob"


def test_an_empty_greeting_leaves_the_name_to_the_model() -> None:
    helper = assistant()
    helper.settings = Settings(_env_file=None, assistant_greeting="  ")
    helper.heard_speaker("alice")
    assert helper.settings.assistant_greeting == "" and helper._greeting_due() is None


@pytest.mark.parametrize("bad", ["Hi there.", "Hi {who}.", "Hi {0}.", "Hi {name"])
def test_a_greeting_must_name_the_speaker(bad: str) -> None:
    with pytest.raises(ValidationError, match="assistant_greeting"):
        Settings(_env_file=None, assistant_greeting=bad)

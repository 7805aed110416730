"""Stop strings in a stream of token texts: held back while they may still be starting, cut when hit."""

from __future__ import annotations

from mediaserver.llm.llama_cpp import _StopScanner


def feed(pieces: list[str], stops: list[str]) -> tuple[str, bool, str]:
    scanner = _StopScanner(stops)
    out = ""
    for piece in pieces:
        text, hit = scanner.push(piece)
        out += text
        if hit:
            return out, True, ""
    return out, False, scanner.flush()


def test_no_stops_passes_everything_at_once() -> None:
    scanner = _StopScanner([])
    assert scanner.push("Hello") == ("Hello", False)
    assert scanner.push(" world") == (" world", False)
    assert scanner.flush() == ""


def test_a_stop_split_over_pieces_is_cut_and_never_emitted() -> None:
    assert feed(["1. Red\n2. B", "lu", "e\n3."], ["Blue"]) == ("1. Red\n2. ", True, "")


def test_a_false_start_is_released_when_it_stops_matching() -> None:
    out, hit, rest = feed(["the Bl", "ack cat"], ["Blue"])
    assert (out + rest, hit) == ("the Black cat", False)


def test_a_held_prefix_at_the_end_is_flushed() -> None:
    assert feed(["ends with Bl"], ["Blue"]) == ("ends with ", False, "Bl")


def test_the_earliest_of_several_stops_wins() -> None:
    assert feed(["a <end> b STOP"], ["STOP", "<end>"]) == ("a ", True, "")

"""Whisper language table and normalization of client-supplied languages."""

from __future__ import annotations

import pytest
from faster_whisper.tokenizer import _LANGUAGE_CODES

from mediaserver.languages import LANGUAGE_ALIASES, WHISPER_LANGUAGES, language_name, normalize_language


def test_codes_match_faster_whisper() -> None:
    assert set(WHISPER_LANGUAGES) == set(_LANGUAGE_CODES)


def test_names_are_lower_case_and_unique() -> None:
    names = list(WHISPER_LANGUAGES.values())
    assert all(name == name.lower() for name in names)
    assert len(set(names)) == len(names)


def test_aliases_cover_every_name() -> None:
    for code, name in WHISPER_LANGUAGES.items():
        assert LANGUAGE_ALIASES[name] == code
    assert set(LANGUAGE_ALIASES.values()) <= set(WHISPER_LANGUAGES)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("en", "en"),
        ("EN", "en"),
        (" de ", "de"),
        ("en-US", "en"),
        ("pt_BR", "pt"),
        ("zh-Hant-TW", "zh"),
        ("yue-HK", "yue"),
        ("haw", "haw"),
        ("German", "de"),
        ("haitian creole", "ht"),
        ("mandarin", "zh"),
        ("Castilian", "es"),
        ("nb-NO", "no"),
        ("jv-ID", "jw"),
    ],
)
def test_normalize_accepts(value: str, expected: str) -> None:
    assert normalize_language(value) == expected


@pytest.mark.parametrize("value", [None, "", "   ", "auto", "AUTO"])
def test_normalize_auto_is_none(value: str | None) -> None:
    assert normalize_language(value) is None


@pytest.mark.parametrize("value", ["xx", "english-ish", "e", "xx-US", "en-", "en--US", "klingon"])
def test_normalize_rejects(value: str) -> None:
    with pytest.raises(ValueError, match="unsupported language"):
        normalize_language(value)


def test_error_names_the_value() -> None:
    with pytest.raises(ValueError, match=r"unsupported language 'xx'"):
        normalize_language(" xx ")


@pytest.mark.parametrize("code", sorted(WHISPER_LANGUAGES))
def test_language_name_round_trip(code: str) -> None:
    name = language_name(code)
    assert name == WHISPER_LANGUAGES[code]
    assert normalize_language(name) == code
    assert normalize_language(code) == code


def test_language_name_examples() -> None:
    assert language_name("en") == "english"
    assert language_name("yue") == "cantonese"


@pytest.mark.parametrize("code", ["xx", "", "english"])
def test_language_name_unknown(code: str) -> None:
    with pytest.raises(ValueError, match="unsupported language"):
        language_name(code)

"""Renamed settings still read their old environment variables, and the new name wins."""

from __future__ import annotations

import pytest

from mediaserver.config import Settings

RENAMED = {  # new field: (old environment variable, a value as the environment spells it, the parsed value)
    "asr_default_model": ("MEDIASERVER_DEFAULT_MODEL", "base", "base"),
    "asr_preload_models": ("MEDIASERVER_PRELOAD_MODELS", '["base"]', ["base"]),
    "asr_extra_models": ("MEDIASERVER_EXTRA_MODELS", '{"mine": "/models/mine"}', {"mine": "/models/mine"}),
    "asr_model_aliases": ("MEDIASERVER_MODEL_ALIASES", '{"fast": "tiny.en"}', {"fast": "tiny.en"}),
}


@pytest.mark.parametrize("field", sorted(RENAMED))
def test_the_old_variable_is_read(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old, raw, value = RENAMED[field]
    default = getattr(Settings(_env_file=None), field)
    assert default != value
    monkeypatch.setenv(old, raw)
    assert getattr(Settings(_env_file=None), field) == value


NEW = {  # new field: (its environment variable's value, the parsed value)
    "asr_default_model": ("small", "small"),
    "asr_preload_models": ('["small"]', ["small"]),
    "asr_extra_models": ('{"theirs": "/models/theirs"}', {"theirs": "/models/theirs"}),
    "asr_model_aliases": ('{"slow": "base"}', {"slow": "base"}),
}


@pytest.mark.parametrize("field", sorted(RENAMED))
def test_the_new_variable_wins(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old, raw, _ = RENAMED[field]
    new_raw, new_value = NEW[field]
    monkeypatch.setenv(old, raw)
    monkeypatch.setenv(f"MEDIASERVER_{field.upper()}", new_raw)
    assert getattr(Settings(_env_file=None), field) == new_value


def test_unprefixed_variables_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEFAULT_MODEL", "base")
    monkeypatch.setenv("ASR_DEFAULT_MODEL", "base")
    assert Settings(_env_file=None).asr_default_model == "tiny.en"


def test_fields_are_set_by_their_name() -> None:
    settings = Settings(_env_file=None, asr_default_model="base", asr_preload_models=[])
    assert (settings.asr_default_model, settings.asr_preload_models) == ("base", [])

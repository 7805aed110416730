"""The speaker store's files: names as the disk lists them, names stored before a limit."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from mediaserver.errors import Conflict, InvalidParameter
from mediaserver.speakers.store import Speaker, SpeakerStore, check_name


def _write(directory: Path, file_name: str, name: str) -> None:
    body = {"name": name, "embedding": [1.0, 0.0, 0.0], "clips": 1, "speech_s": 5.0, "enrolled_at": 0.0}
    (directory / file_name).write_text(json.dumps(body))


def _speaker(name: str) -> Speaker:
    return Speaker(name, np.array([0.0, 1.0, 0.0], np.float32), 1, 5.0, 0.0)


def test_a_file_listed_decomposed_is_renamed_and_deleted_for_good(tmp_path: Path) -> None:
    # A review: a file a disk listed decomposed (NFD) was read, but DELETE unlinked the composed name,
    # so the speaker came back at the next start.
    decomposed = unicodedata.normalize("NFD", "Zoë")
    _write(tmp_path, f"{decomposed}.json", "Zoë")
    store = SpeakerStore(tmp_path, 10)
    store.load()
    assert [s.name for s in store.snapshot()] == ["Zo\u00eb"] and not store.problems
    assert [p.name for p in tmp_path.glob("*.json")] == ["Zo\u00eb.json"]
    store.delete("Zoë")
    again = SpeakerStore(tmp_path, 10)
    again.load()
    assert again.snapshot() == [] and list(tmp_path.glob("*.json")) == []


def test_a_name_stored_before_the_byte_limit_still_loads(tmp_path: Path) -> None:
    long_name = "\U00020000" * 55  # 220 bytes: enrolled before the 200-byte limit
    with pytest.raises(InvalidParameter):
        check_name(long_name)
    _write(tmp_path, f"{long_name}.json", long_name)
    store = SpeakerStore(tmp_path, 10)
    store.load()  # (it raised InvalidParameter out of load: the speakers service did not start)
    assert [s.name for s in store.snapshot()] == [long_name] and not store.problems


def test_case_twins(tmp_path: Path) -> None:
    _write(tmp_path, "reader.json", "reader")
    _write(tmp_path, "Reader.json", "Reader")  # a store from before the rule
    store = SpeakerStore(tmp_path, 10)
    store.load()
    assert store.put(_speaker("reader"), replace=True)  # the exact name is re-enrolled, twin or not
    with pytest.raises(Conflict):
        store.put(_speaker("READER"), replace=True)

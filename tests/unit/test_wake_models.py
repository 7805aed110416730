"""Wake word models: the built-ins from the pymicro-wakeword wheel and a directory of custom ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mediaserver.wake.detector import WakeDetector
from mediaserver.wake.models import UnknownWakeModel, WakeModels
from tests.conftest import synthesize


def test_builtin_models() -> None:
    models = WakeModels.load()
    assert models.names() == ["alexa", "hey_jarvis", "hey_mycroft", "okay_nabu"]
    nabu = models.get("okay_nabu")
    assert nabu.phrase == "Okay Nabu" and nabu.builtin and 0 < nabu.probability_cutoff < 1


def test_custom_directory_adds_models_and_skips_broken_ones(tmp_path: Path) -> None:
    builtin = WakeModels.load().get("hey_jarvis")
    shutil.copy(builtin.tflite_path, tmp_path / "hey_house.tflite")
    config: dict[str, object] = {
        "type": "micro",
        "wake_word": "Hey House",
        "model": "hey_house.tflite",
        "trained_languages": ["en"],
    }
    config["micro"] = {"probability_cutoff": 0.9, "sliding_window_size": 5}
    (tmp_path / "hey_house.json").write_text(json.dumps(config))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "missing.json").write_text(json.dumps({**config, "model": "missing.tflite"}))
    (tmp_path / "outside.json").write_text(json.dumps({**config, "model": "../etc/passwd"}))
    models = WakeModels.load(tmp_path)
    assert "hey_house" in models.names() and "broken" not in models.names()
    assert len(models.names()) == 5
    house = models.get("hey_house")
    assert not house.builtin and house.phrase == "Hey House" and house.probability_cutoff == 0.9
    # It runs: the copied network still hears "hey jarvis", reported under the custom name.
    audio = np.concatenate([np.zeros(16000, np.float32), synthesize("hey jarvis, what time is it").audio16k])
    with WakeDetector(models, ["Hey House"]) as detector:
        assert [d.name for d in detector.process_float(audio)] == ["hey_house"]


def test_unknown_names_list_the_models() -> None:
    with pytest.raises(UnknownWakeModel) as caught:
        WakeModels.load().resolve(["okay_nabu", "computer"])
    assert "'computer'" in caught.value.message and "okay_nabu" in caught.value.message


def test_refractory_period_reports_a_word_once() -> None:
    audio = np.concatenate([np.zeros(16000, np.float32), synthesize("okay nabu").audio16k, np.zeros(16000)])
    with WakeDetector(WakeModels.load(), ["okay_nabu"], refractory_s=2.0) as detector:
        found = detector.process_float(np.concatenate([audio, audio]))  # twice, 3 s apart
        assert [d.name for d in found] == ["okay_nabu", "okay_nabu"]
        assert found[1].timestamp_ms - found[0].timestamp_ms >= 2000


def test_close_while_idle_then_process_is_harmless() -> None:
    detector = WakeDetector(WakeModels.load(), ["alexa"])
    detector.close()
    assert detector.process(b"\x00\x00" * 1600) == []

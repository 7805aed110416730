"""The turn model's input features and its batched scoring on the real Smart Turn v3.2 file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from mediaserver.config import Settings
from mediaserver.turns.features import WINDOW_SAMPLES, last_window, log_mel, mel_filters
from mediaserver.turns.fetch import MODEL_SHA256, default_dir, fetch, is_valid
from mediaserver.turns.model import TurnModel, load_shared, shared, status
from tests.conftest import synthesize


def test_window_keeps_the_end_and_pads_the_start() -> None:
    short = np.ones(16_000, np.float32)
    window = last_window(short)
    assert window.size == WINDOW_SAMPLES and not window[:-16_000].any() and window[-16_000:].all()
    long = np.arange(WINDOW_SAMPLES + 5, dtype=np.float32)
    assert np.array_equal(last_window(long), long[5:])


def test_features_shape_range_and_padding() -> None:
    audio = synthesize("What is the capital of France?").audio16k.astype(np.float32)
    features = log_mel(audio)
    assert features.shape == (80, 800) and features.dtype == np.float32
    # Whisper's scaling: at most 8 (log10 units) below the maximum, mapped by (x + 4) / 4.
    assert features.max() - features.min() <= 2.0 + 1e-6
    # A clip shorter than 8 s is the same as the clip zero-padded at its start to 8 s.
    assert np.array_equal(features, log_mel(np.concatenate([np.zeros(WINDOW_SAMPLES - audio.size, np.float32), audio])))
    filters = mel_filters()
    assert filters.shape == (80, 201) and (filters >= 0).all() and (filters.sum(axis=1) > 0).all()


@pytest.fixture(scope="module")
def model() -> TurnModel:
    path = fetch(default_dir())
    assert is_valid(path), f"{path} is not the pinned file (SHA-256 {MODEL_SHA256})"
    return TurnModel(path, batch_max=8)


async def test_scores_of_several_sessions_are_batched_and_equal_alone(model: TurnModel) -> None:
    """Pauses scored at once share a batch; each gets the score it would get alone."""
    pause = np.zeros(3200, np.float32)
    clips = [
        np.concatenate([synthesize(text).audio16k.astype(np.float32), pause])
        for text in ("What is the capital of France?", "So, um,", "Turn off the lights in the bedroom.", "and then")
    ]
    alone = [model.score_now([clip])[0].probability for clip in clips]
    together = await asyncio.gather(*(model.score(clip) for clip in clips))
    assert max(score.batch for score in together) > 1
    assert np.allclose([score.probability for score in together], alone, atol=1e-4)
    # Finished sentences score high, fragments ending on a word no sentence ends on score low.
    assert alone[0] > 0.5 and alone[2] > 0.5 and alone[1] < 0.5 and alone[3] < 0.5, alone


def test_a_missing_model_file_turns_semantic_turns_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No file: a clear log line and no model (sessions that ask for semantic turns end on silence)."""
    settings = Settings(_env_file=None, turn_model_path=tmp_path / "missing.onnx")
    with caplog.at_level("WARNING"):
        assert load_shared(settings) is None
    assert shared(settings) is None
    assert any("semantic end of turn is off" in record.getMessage() for record in caplog.records)


def test_a_corrupt_model_file_turns_semantic_turns_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A file that is not an ONNX model: the server starts without it, says so once, and reports it."""
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(b"not an onnx model" * 100)
    settings = Settings(_env_file=None, turn_model_path=path, turn_detection="semantic")
    with caplog.at_level("WARNING"):
        assert load_shared(settings) is None
        assert load_shared(settings) is None  # asked again: not loaded again, not logged again
    said = [r for r in caplog.records if "could not be loaded" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0].getMessage()
    assert status(settings) == {
        "default": "semantic",
        "default_in_force": "silence",
        "default_for": {"voice_loop": "silence", "transcription": "silence"},
        "model_loaded": False,
        "in_memory": False,
        "model_path": str(path),
    }

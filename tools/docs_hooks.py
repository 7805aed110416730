"""MkDocs hooks of the docs site (mkdocs.yml ``hooks:``): the pages made from the code and tools/README.md.

- ``configuration.md`` is generated from ``Settings`` at build time (tools/gen_config_docs.py), so it
  lists every setting with the code's default and cannot drift.
- ``benchmarks.md`` takes in tools/README.md (where the benchmarks write their figures) at its
  ``<!-- include: tools/README.md -->`` marker, its title dropped, its headings one level down and its links to
  ``../docs/`` made relative to the site, so the figures have one home and the site shows them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tools"):  # mediaserver (when not installed) and gen_config_docs beside this file
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from gen_config_docs import render  # noqa: E402
from mkdocs.structure.files import File, Files  # noqa: E402
from mkdocs.structure.pages import Page  # noqa: E402

INCLUDE = "<!-- include: tools/README.md -->"


def tools_readme() -> str:
    """tools/README.md as a part of benchmarks.md: headings one level down, links into the site."""
    text = (ROOT / "tools" / "README.md").read_text(encoding="utf-8")
    text = text.split("\n", 1)[1] if text.startswith("# ") else text  # its title: the page has its own
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,5} ", line):
            line = "#" + line
        out.append(line)
    return "\n".join(out).replace("](../docs/", "](")


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "configuration.md", content=render()))
    return files


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    if page.file.src_uri == "benchmarks.md":
        assert INCLUDE in markdown, f"benchmarks.md has lost its {INCLUDE} marker"
        markdown = markdown.replace(INCLUDE, tools_readme())
    return markdown

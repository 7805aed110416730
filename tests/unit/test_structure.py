"""The package's shape: no import circle inside mediaserver, and no face under transport/ that
imports another (DESIGN.md: "one folder per protocol family, no face imports another").

Both read the source with ``ast``, so they see every import of a mediaserver module wherever it
stands: at module level, under ``if TYPE_CHECKING:`` and inside functions. A circle that only the
type checker or a function-level import walks is still two modules that each need the other; the
four circles issue #35 named were all of that kind.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import mediaserver

PACKAGE_DIR = Path(mediaserver.__file__).parent
TRANSPORT = "mediaserver.transport"
# Subpackages of transport/ that several faces share and none owns: they are not faces, and they
# import no face.
SHARED_PACKAGES = {f"{TRANSPORT}.rtc_peer"}


def module_files(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Every module below ``root`` (the directory of ``package``): dotted name -> (file, is a package)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    return modules


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (``from a import b`` names ``a.b`` when that is
    a module, else ``a``)."""
    modules = module_files(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                graph[name].update(alias.name for alias in node.names if alias.name in modules)
                continue
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    graph[name].add(f"{source}.{alias.name}")
                elif source in modules:
                    graph[name].add(source)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module importing itself
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checker itself: circles through TYPE_CHECKING, function-level and relative imports count."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import Thing\n")
    (package / "sub" / "c.py").write_text("def f() -> None:\n    from . import d\n")
    (package / "sub" / "d.py").write_text("from ..sub.c import f\n")
    (package / "e.py").write_text("import pkg.a\nfrom pkg.sub import c\n")
    graph = import_graph(package, "pkg")
    assert graph["pkg.e"] == {"pkg.a", "pkg.sub.c"}
    assert circles(graph) == [["pkg.a", "pkg.b"], ["pkg.sub.c", "pkg.sub.d"]]


def test_no_import_circle_in_mediaserver() -> None:
    graph = import_graph(PACKAGE_DIR, "mediaserver")
    assert len(graph) > 100  # it read the package
    assert circles(graph) == []


def _face_of(module: str, faces: set[str]) -> str | None:
    """The face a module belongs to: the longest face that is it or contains it."""
    owners = [face for face in faces if module == face or module.startswith(face + ".")]
    return max(owners, key=len) if owners else None


def transport_faces(root: Path) -> set[str]:
    """The subpackages of transport/ and of transport/openai/, less the shared ones."""
    transport_dir = root / "transport"
    faces: set[str] = set()
    for parent, dotted in ((transport_dir, TRANSPORT), (transport_dir / "openai", f"{TRANSPORT}.openai")):
        faces.update(f"{dotted}.{init.parent.name}" for init in parent.glob("*/__init__.py"))
    return faces - SHARED_PACKAGES


def face_crossings(root: Path) -> list[str]:
    """Every import by a module under transport/ of a face not its own (its family's is its own)."""
    faces = transport_faces(root)
    crossings = []
    for module, imported in sorted(import_graph(root, "mediaserver").items()):
        if not module.startswith(TRANSPORT + "."):
            continue  # app.py wires every face in
        mine = _face_of(module, faces)  # None: a shared helper or package
        for target in sorted(imported):
            theirs = _face_of(target, faces)
            if theirs is None or theirs == mine or (mine is not None and mine.startswith(theirs + ".")):
                continue
            crossings.append(f"{module} -> {target}")
    return crossings


def test_no_face_imports_another() -> None:
    """A face may use the shared helpers (transport/*.py, the shared packages) and its own family's
    modules (realtime/ those of openai/), never a sibling face; what is shared uses no face."""
    faces = {face.removeprefix(TRANSPORT + ".") for face in transport_faces(PACKAGE_DIR)}
    assert {"webrtc", "ws", "wyoming", "wis", "openai", "openai.realtime"} <= faces
    assert all((PACKAGE_DIR.parent / shared.replace(".", "/") / "__init__.py").is_file() for shared in SHARED_PACKAGES)
    assert face_crossings(PACKAGE_DIR) == []

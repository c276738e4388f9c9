"""Imports point down, never sideways, never in a circle (docs/architecture.md, "Layers").

Every module of tuner/, workers/, api/ and schedules/ is read as source (its AST: imports inside
functions count, relative imports are resolved, imports under `if TYPE_CHECKING:` do not run and
do not count). Each module belongs to one package of one layer, as pyproject.toml's
`[tool.tunefarm.layers]` says (the one table of layers; docs/architecture.md's table must match
it). A module may import its own package and any lower layer; the test fails on an import that
points up, on one sideways into another package of the same layer (core packages may use each
other), and on any cycle between modules. A module in no layer fails too: place it first.

An import resolves to the deepest module it names (`from tuner.db import jobs` is
`tuner.db.jobs`; `from tuner.db import Store` is the package `tuner.db`); the implicit import of
a package's `__init__` by its submodules is not an edge.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "workers", "api", "schedules")

def read_layers(pyproject: Path) -> list[tuple[int, str, str, tuple[str, ...]]]:
    """(layer index, layer name, package, module prefixes) from `[tool.tunefarm.layers]`."""
    table = tomllib.loads(pyproject.read_text())["tool"]["tunefarm"]["layers"]
    return [(i, layer["name"], package, tuple(prefixes))
            for i, layer in enumerate(table) for package, prefixes in layer["packages"].items()]


# (layer, package, module prefixes): a prefix names a module and its submodules, the longest
# matching prefix wins; "tuner" alone is only tuner/__init__.py
TABLE = read_layers(ROOT / "pyproject.toml")
LAYERS: list[tuple[int, str, tuple[str, ...]]] = [(i, pkg, pre) for i, _, pkg, pre in TABLE]
LAYER_NAMES = {i: name for i, name, _, _ in TABLE}
CORE = 0  # packages of the lowest layer may import each other


@dataclass(frozen=True)
class Import:
    importer: str  # module name
    path: Path
    line: int
    target: str  # the internal module it resolves to
    text: str  # the import as written


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def collect(root: Path) -> dict[str, Path]:
    """Every module of the packages under `root`, by name."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")) if (root / pkg).is_dir() else []:
            out[module_name(root, path)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except the body of `if TYPE_CHECKING:`."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _deepest(name: str, modules: dict[str, Path]) -> str | None:
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The internal imports of module `name` (at `path`), each resolved to a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in _import_nodes(tree):
        text = ast.unparse(node)
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        for t in dict.fromkeys(targets):
            if t.split(".")[0] not in PACKAGES:
                continue
            resolved = _deepest(t, modules)
            if resolved is not None and resolved != name:
                out.append(Import(name, path, node.lineno, resolved, text))
    return out


def layer_of(module: str) -> tuple[int, str] | None:
    best: tuple[int, int, str] | None = None  # (prefix length, layer, package)
    for layer, package, prefixes in LAYERS:
        for prefix in prefixes:
            matches = module == prefix or (module.startswith(prefix + ".") and prefix != "tuner")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer, package)
    return None if best is None else (best[1], best[2])


def _where(imp: Import, root: Path) -> str:
    return f"{imp.path.relative_to(root)}:{imp.line}: `{imp.text}`"


def _describe(module: str) -> str:
    layer = layer_of(module)
    assert layer is not None
    return f"{module} (layer {layer[0]} {LAYER_NAMES[layer[0]]}, {layer[1]})"


def find_cycles(edges: dict[str, dict[str, Import]]) -> list[tuple[list[str], list[str]]]:
    """One cycle (a closed path of modules) per strongly connected component that has one, with
    the component's modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    sccs: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:  # Tarjan, iteratively (no recursion limit on long chains)
        work = [(v, iter(sorted(edges.get(v, {}))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        scc.append(w)
                        if w == node:
                            break
                    sccs.append(scc)

    for v in sorted(edges):
        if v not in index:
            connect(v)
    cycles = []
    for scc in sccs:
        members = set(scc)
        if len(scc) == 1 and scc[0] not in edges.get(scc[0], {}):
            continue
        start = min(scc)
        # shortest path back to `start` inside the component (breadth first)
        prev: dict[str, str] = {}
        frontier, seen, found = [start], {start}, None
        while frontier and found is None:
            nxt = []
            for u in frontier:
                for w in sorted(edges.get(u, {})):
                    if w == start:
                        found = u
                        break
                    if w in members and w not in seen:
                        seen.add(w)
                        prev[w] = u
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        assert found is not None
        path = [found]
        while path[-1] != start:
            path.append(prev[path[-1]])
        cycles.append(([*reversed(path), start], sorted(scc)))
    return cycles


def check(root: Path) -> list[str]:
    """Every layering problem of the packages under `root`, one message each."""
    modules = collect(root)
    problems: list[str] = []
    edges: dict[str, dict[str, Import]] = {}
    for name, path in modules.items():
        if layer_of(name) is None:
            problems.append(f"{path.relative_to(root)}: module {name} is in no layer: add it to "
                            "[tool.tunefarm.layers] in pyproject.toml")
        for imp in imports_of(name, path, modules):
            edges.setdefault(name, {}).setdefault(imp.target, imp)
            src, dst = layer_of(name), layer_of(imp.target)
            if src is None or dst is None:
                continue
            if dst[0] > src[0]:
                problems.append(f"{_where(imp, root)} points up: {_describe(name)} imports "
                                f"{_describe(imp.target)}")
            elif dst[0] == src[0] and dst[1] != src[1] and src[0] != CORE:
                problems.append(f"{_where(imp, root)} is sideways: {_describe(name)} imports "
                                f"{_describe(imp.target)}")
    problems.sort()
    for cycle, component in find_cycles(edges):
        steps = [_where(edges[a][b], root) for a, b in pairwise(cycle)]
        more = "" if len(component) < len(cycle) else (
            f"\n  (one of the cycles among {', '.join(component)})")
        problems.append(f"import cycle {' -> '.join(cycle)}:\n    " + "\n    ".join(steps) + more)
    return problems


def test_imports_point_down_without_cycles() -> None:
    problems = check(ROOT)
    assert not problems, f"{len(problems)} layering problem(s):\n" + "\n".join(problems)


def test_only_the_tvm_adapter_imports_tvm() -> None:
    """`tuner/core/tvm_api.py` is the one module that imports `tvm` or `tvm_ffi` (a TVM module move
    then touches one file); everything else goes through it."""
    offenders = []
    for name, path in collect(ROOT).items():
        if name == "tuner.core.tvm_api":
            continue
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if node.level == 0 else [])
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                          if n.split(".")[0] in ("tvm", "tvm_ffi")]
    assert not offenders, "\n".join(offenders)


def test_every_module_imports() -> None:
    """Every module of the packages imports (mypy, with `ignore_missing_imports`, lets a
    relative import of a module that was moved away pass; a process would fail on it)."""
    import importlib

    failed = []
    for name in collect(ROOT):
        if name.endswith("__main__") or ".migrations." in name:  # run by their tools only
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    assert not failed, "\n".join(failed)


# --- the checker catches what it should (a tree of fake modules) ------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


BASE = {"tuner/__init__.py": "", "tuner/core/errors.py": "", "tuner/core/config.py": "",
        "tuner/cli/__init__.py": "", "tuner/search/__init__.py": "",
        "tuner/search/loop.py": "", "workers/tuner_service.py": "",
        "workers/__init__.py": "", "workers/agent.py": "", "api/__init__.py": "",
        "api/client.py": "", "api/app.py": "", "schedules/__init__.py": ""}


def test_the_checker_reports_an_upward_import_with_file_line_and_layers(tmp_path: Path) -> None:
    root = _tree(tmp_path, {**BASE, "tuner/core/errors.py": '"""Errors."""\n\n\ndef f():\n'
                                                       '    import tuner.cli\n'})
    problems = check(root)
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        "tuner/core/errors.py:5: `import tuner.cli` points up: tuner.core.errors "
        "(layer 0 core, core) imports tuner.cli (layer 5 cli, cli)")
    assert not check(_tree(tmp_path, {"tuner/core/errors.py": ""}))  # fixed: clean


def test_the_checker_reports_sideways_imports_and_allows_them_in_core(tmp_path: Path) -> None:
    root = _tree(tmp_path, {**BASE, "api/client.py": "from tuner.search import loop\n",
                            "api/app.py": "from workers import agent\nfrom api import client\n",
                            "tuner/core/config.py": "from tuner.core import errors\n"})
    problems = check(root)
    assert [p.split(" is sideways")[0] for p in problems] == [
        "api/app.py:1: `from workers import agent`",
        "api/client.py:1: `from tuner.search import loop`"], problems


def test_the_checker_reports_cycles_through_function_local_and_relative_imports(
        tmp_path: Path) -> None:
    root = _tree(tmp_path, {**BASE, "tuner/core/errors.py": "from . import config\n",
                            "tuner/core/config.py": "def f():\n    from .errors import E\n"})
    (problem,) = check(root)
    assert problem.startswith(
        "import cycle tuner.core.config -> tuner.core.errors -> tuner.core.config:")
    assert "tuner/core/config.py:2: `from .errors import E`" in problem
    assert "tuner/core/errors.py:1: `from . import config`" in problem


def test_the_checker_ignores_type_checking_imports_and_flags_unplaced_modules(
        tmp_path: Path) -> None:
    root = _tree(tmp_path, {**BASE, "tuner/core/errors.py": "from typing import TYPE_CHECKING\n"
                                                       "if TYPE_CHECKING:\n"
                                                       "    from tuner.cli import app\n",
                            "tuner/extra.py": ""})
    assert check(root) == ["tuner/extra.py: module tuner.extra is in no layer: add it to "
                           "[tool.tunefarm.layers] in pyproject.toml"]


# --- the picture per folder, and docs/architecture.md against the table ------------------------

DOC = ROOT / "docs" / "architecture.md"
PICTURE_START = "<!-- the imports per folder: written by `python -m tests.test_layers` -->"


def folder_of(module: str) -> str:
    """The folder a module is drawn in: `tuner/<sub>` and `api/client`, else its top folder
    (`tuner/__main__.py` is drawn with the CLI it starts)."""
    parts = module.split(".")
    if module == "tuner.__main__":
        return "tuner/cli"
    if parts[0] == "tuner" and len(parts) > 1 and (ROOT / "tuner" / parts[1]).is_dir():
        return f"tuner/{parts[1]}"
    if parts[:2] == ["api", "client"]:
        return "api/client"
    return parts[0]


def folder_edges(root: Path) -> dict[tuple[str, str], int]:
    """(importing folder, imported folder) -> how many module imports the arrow stands for."""
    modules = collect(root)
    edges: dict[tuple[str, str], int] = {}
    for name, path in modules.items():
        for imp in imports_of(name, path, modules):
            a, b = folder_of(name), folder_of(imp.target)
            if a != b:
                edges[(a, b)] = edges.get((a, b), 0) + 1
    return edges


def folder_layers(root: Path) -> dict[str, int]:
    """Each folder's layer: the one layer all its modules are in (the test below checks that)."""
    out: dict[str, set[int]] = {}
    for name in collect(root):
        layer = layer_of(name)
        if layer is not None and name != "tuner":  # tuner/__init__.py: the version only
            out.setdefault(folder_of(name), set()).add(layer[0])
    return {f: max(ls) for f, ls in out.items()}


def picture(root: Path) -> str:
    """The folder picture as a Mermaid flowchart: one box per folder in its layer's row, top
    layer first, an arrow per importing folder pair (arrows point at what is imported)."""
    layers = folder_layers(root)
    lines = [PICTURE_START, "```mermaid", "flowchart TB"]
    node = {f: f.replace("/", "_") for f in layers}
    for i in sorted(LAYER_NAMES, reverse=True):
        folders = sorted(f for f, layer in layers.items() if layer == i)
        lines.append(f"  subgraph L{i}[\"{i} {LAYER_NAMES[i]}\"]")
        lines += [f"    {node[f]}[\"{f}/\"]" for f in folders]
        lines.append("  end")
    for a, b in sorted(folder_edges(root)):
        if a in node and b in node:
            lines.append(f"  {node[a]} --> {node[b]}")
    lines.append("```")
    return "\n".join(lines)


def test_every_folder_is_in_one_layer_and_no_folder_arrow_points_up() -> None:
    """The picture per folder: a folder's modules share one layer, and an arrow between
    folders points down or sideways within core; the CLI is the top layer, so nothing imports
    it and its arrows all point down."""
    per_folder: dict[str, set[int]] = {}
    for name in collect(ROOT):
        layer = layer_of(name)
        assert layer is not None
        if name != "tuner":
            per_folder.setdefault(folder_of(name), set()).add(layer[0])
    mixed = {f: sorted(ls) for f, ls in per_folder.items() if len(ls) > 1}
    assert not mixed, f"folders whose modules are in several layers: {mixed}"
    layers = folder_layers(ROOT)
    edges = folder_edges(ROOT)
    wrong = [f"{a} -> {b}" for a, b in edges if not (
        layers[b] < layers[a]
        or (layers[b] == layers[a] and (layers[a] == CORE or _same_package(a, b))))]
    assert not wrong, f"folder arrows pointing up or sideways: {wrong}"
    graph: dict[str, dict[str, object]] = {}
    for a, b in edges:
        graph.setdefault(a, {})[b] = None
    assert not find_cycles(graph), "the folders import each other in a circle"  # type: ignore[arg-type]


def _same_package(a: str, b: str) -> bool:
    """Two folders of one package of the layer table (tuner/search, tuner/interop, tuner/model)."""
    def package(folder: str) -> str | None:
        found = layer_of(folder.replace("/", "."))
        return None if found is None else found[1]

    return package(a) is not None and package(a) == package(b)


def test_the_architecture_page_draws_the_imports_and_lists_the_layers_of_the_table() -> None:
    text = DOC.read_text()
    drawn = picture(ROOT)
    start = text.find(PICTURE_START)
    assert start >= 0 and text[start:start + len(drawn)] == drawn, (
        "docs/architecture.md's picture of the imports is not the code's: run "
        "`python -m tests.test_layers` and paste what it prints")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\| \d+ \w+ \|", line)]
    assert [r.split("|")[1].strip() for r in rows] == [
        f"{i} {LAYER_NAMES[i]}" for i in sorted(LAYER_NAMES, reverse=True)]
    for i, _, _, prefixes in TABLE:
        row = next(r for r in rows if r.startswith(f"| {i} "))
        for prefix in prefixes:
            path = prefix.replace(".", "/")
            shown = path if (ROOT / f"{path}.py").is_file() or prefix == "tuner" else path + "/"
            if prefix == "tuner":
                continue  # the package's __init__: nothing but the version
            assert f"`{shown}" in row, f"layer {i}'s row in docs/architecture.md lacks `{shown}`"


if __name__ == "__main__":
    print(picture(ROOT))

"""The packages of ``searchr1`` stand in layers (docs/layers.md): each imports only itself and the
packages of lower layers, so no two packages import each other, even through others; and no
module imports one that imports it back within its package. Every import statement counts,
wherever it stands (inside functions and ``if TYPE_CHECKING:`` blocks too), relative ones resolved.

``python tests/test_layers.py`` prints the graph as it is: the circles between packages, with the
imports that close them, and the circles between the modules of one package.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "searchr1"
LAYERS_DOC = PACKAGE.parent / "docs" / "layers.md"
CONTRIBUTING = PACKAGE.parent / "CONTRIBUTING.md"

# Lowest first. A package may import its own modules and the packages of lower layers, never one of
# its own layer or above. "searchr1" is the package's __init__; "cli" and "__main__" are the
# modules beside it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("searchr1",),            # the version
    ("core",),                # one Search-R1 step: imports only itself
    ("basics",),              # small pure helpers every layer shares: wording, files, JSON lines, ...
    ("runtime", "offline"),   # tokenizer, PyTRIO connection, server bounds; the shipped offline files
    ("data",),                # the dataset
    ("bm25",),                # our own search engine
    ("search",),              # the search backends (local over bm25)
    ("health", "run"),        # diagnostics and rules; the run directory and its records
    ("export",),              # a checkpoint taken home
    ("evaluation",),          # eval loop, metrics, card, transcripts
    ("training", "twin"),     # the run loop around the core; the offline PyTRIO twin
    ("view",),                # transcripts and plots shown
    ("wiring",),              # the services a command runs with, brought up together
    ("serve", "tools"),       # the chat server; golden trajectories and the loss probe
    ("bench",),               # the benchmarks
    ("commands",),            # click code, one module per command
    ("cli",),                 # the entry point
    ("__main__",),            # python -m searchr1
)


@dataclass(frozen=True)
class Import:
    """One module of ``searchr1`` importing another: where (file and line) and what."""

    where: str
    line: int
    source: str
    target: str

    def __str__(self) -> str:
        return f"{self.where}:{self.line} imports {self.target}"


def module_paths(root: Path = PACKAGE) -> dict[str, Path]:
    """Each module below ``root`` by its dotted name (a package by its own name, not ``__init__``)."""
    return {".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): path
            for path in sorted(root.rglob("*.py"))}


def imports(root: Path = PACKAGE) -> list[Import]:
    """Every import of a ``searchr1`` module by another, as the module it names: ``from x import y``
    names ``x.y`` when that is a module, else ``x``; a name below a module is that module."""
    modules = module_paths(root)
    top = root.name
    found = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text("utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                named = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules] or [base]
            else:
                continue
            for target in named:
                if target != top and not target.startswith(top + "."):
                    continue
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                found.append(Import(str(path.relative_to(root.parent)), node.lineno, module, target))
    return sorted(found, key=lambda item: (item.where, item.line, item.target))


def package_of(module: str) -> str:
    """``searchr1.x.y`` is in package ``x``; ``searchr1`` itself is the package's root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_violations(found: Iterable[Import], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Each import of a package of the importer's own layer or above, or of an undeclared one."""
    rank = {name: index for index, layer in enumerate(layers) for name in layer}
    wrong = []
    for item in found:
        source, target = package_of(item.source), package_of(item.target)
        if source == target:
            continue
        if source not in rank or target not in rank:
            missing = source if source not in rank else target
            wrong.append(f"{item}: package {missing} is in no layer")
        elif rank[target] >= rank[source]:
            wrong.append(f"{item}: {target} is {'beside' if rank[target] == rank[source] else 'above'} {source}")
    return wrong


def components(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted: the nodes
    that reach one another through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(set(graph) | {t for targets in graph.values() for t in targets}):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def package_circles(found: list[Import]) -> list[tuple[list[str], list[str]]]:
    """Each group of packages that import one another, with the imports between them."""
    graph: dict[str, set[str]] = {}
    for item in found:
        if package_of(item.source) != package_of(item.target):
            graph.setdefault(package_of(item.source), set()).add(package_of(item.target))
    return [(circle, [str(item) for item in found if package_of(item.source) in circle
                      and package_of(item.target) in circle and package_of(item.source) != package_of(item.target)])
            for circle in components(graph)]


def module_circles(found: list[Import]) -> list[tuple[list[str], list[str]]]:
    """Each group of modules of one package that import one another, with the imports between them."""
    graph: dict[str, set[str]] = {}
    for item in found:
        if item.source != item.target and package_of(item.source) == package_of(item.target):
            graph.setdefault(item.source, set()).add(item.target)
    return [(circle, [str(item) for item in found if item.source in circle and item.target in circle
                      and item.source != item.target])
            for circle in components(graph)]


def test_every_package_stands_in_one_layer():
    packages = {package_of(module) for module in module_paths()}
    declared = [name for layer in LAYERS for name in layer]
    assert len(declared) == len(set(declared)), "a package is declared in two layers"
    assert sorted(packages - set(declared)) == [], "packages in no layer: place them in LAYERS"
    assert sorted(set(declared) - packages) == [], "layers name packages that do not exist"


def test_every_import_is_of_the_own_package_or_a_lower_layer():
    assert layer_violations(imports()) == []


def test_no_packages_import_one_another():
    assert package_circles(imports()) == []


def test_no_modules_of_one_package_import_one_another():
    assert module_circles(imports()) == []


def test_the_basics_import_the_standard_library_the_core_and_one_another_only():
    """The shared helpers stay small: nothing of a third party, nothing of the harness."""
    paths = sorted((PACKAGE / "basics").rglob("*.py"))
    assert paths, "searchr1/basics/ holds the shared helpers"
    wrong = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text("utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                names = [node.module or ""]
            else:
                continue
            wrong += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {name}" for name in names
                      if not (name.split(".")[0] in sys.stdlib_module_names
                              or re.match(r"searchr1\.(core|basics)(\.|$)", name))]
    assert wrong == []


def documented_layers(text: str) -> list[tuple[int, str, str]]:
    """``(layer, package, uses)`` of each row of the table in docs/layers.md."""
    rows = re.findall(r"^\| (\d+) \| `([\w/.]+)`[^|]*\|[^|]*\| ([^|]*) \|$", text, flags=re.MULTILINE)
    return [(int(layer), name.removesuffix("/").removesuffix(".py"), uses) for layer, name, uses in rows]


def test_the_documented_order_is_the_declared_one_and_says_what_each_package_uses():
    """docs/layers.md's table and CONTRIBUTING's order are ``LAYERS``; each row's "Uses" is what
    the package imports."""
    rows = documented_layers(LAYERS_DOC.read_text("utf-8"))
    assert [(layer, name) for layer, name, _ in rows] == [
        (index, name) for index, packages in enumerate(LAYERS) for name in packages]
    order = re.search(r"^core < .*?(?=^```)", CONTRIBUTING.read_text("utf-8"), flags=re.MULTILINE | re.DOTALL)
    assert order is not None, "CONTRIBUTING's Layers section shows the order"
    shown = [tuple(name.strip() for name in layer.split(",")) for layer in order.group().split("<")]
    assert shown == list(LAYERS[1:-1])  # the root and __main__ left out
    used: dict[str, set[str]] = {}
    for item in imports():
        if package_of(item.source) != package_of(item.target):
            used.setdefault(package_of(item.source), set()).add(package_of(item.target))
    wrong = {}
    for _, name, uses in rows:
        if uses in ("most of the above", "any package"):
            continue
        listed = set() if uses in ("nothing", "itself only") else {use.strip() for use in uses.split(",")}
        if listed != used.get(name, set()):
            wrong[name] = f"docs/layers.md says {sorted(listed)}, the imports {sorted(used.get(name, set()))}"
    assert wrong == {}


def write_tree(root: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")
    return root / "searchr1"


def test_the_probe_names_each_import_against_the_order_wherever_it_stands(tmp_path):
    """The checks can fail: an import inside a function, one under ``TYPE_CHECKING``, a relative
    one and a ``from package import module`` are each seen, named by file and line."""
    root = write_tree(tmp_path, {
        "searchr1/__init__.py": "",
        "searchr1/low/__init__.py": "",
        "searchr1/low/a.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from searchr1.high.b import B\n"
                              "def f():\n    from ..high import b\n"),
        "searchr1/low/c.py": "import json\nfrom searchr1.low import a\nfrom searchr1 import low\n",
        "searchr1/high/__init__.py": "",
        "searchr1/high/b.py": "from searchr1.low.a import f\nfrom .d import D\n",
        "searchr1/high/d.py": "def g():\n    from searchr1.high import b\n",
        "searchr1/side.py": "from searchr1.high import b\n",
    })
    found = imports(root)
    layers = (("searchr1",), ("low", "side"), ("high",))
    assert layer_violations(found, layers) == [
        "searchr1/low/a.py:3 imports searchr1.high.b: high is above low",
        "searchr1/low/a.py:5 imports searchr1.high.b: high is above low",
        "searchr1/side.py:1 imports searchr1.high.b: high is above side",
    ]
    assert layer_violations(found, (("searchr1",), ("low",))) == [
        "searchr1/high/b.py:1 imports searchr1.low.a: package high is in no layer",
        "searchr1/low/a.py:3 imports searchr1.high.b: package high is in no layer",
        "searchr1/low/a.py:5 imports searchr1.high.b: package high is in no layer",
        "searchr1/side.py:1 imports searchr1.high.b: package side is in no layer",
    ]
    assert package_circles(found) == [(["high", "low"], [
        "searchr1/high/b.py:1 imports searchr1.low.a",
        "searchr1/low/a.py:3 imports searchr1.high.b",
        "searchr1/low/a.py:5 imports searchr1.high.b",
    ])]
    assert module_circles(found) == [(["searchr1.high.b", "searchr1.high.d"], [
        "searchr1/high/b.py:2 imports searchr1.high.d",
        "searchr1/high/d.py:2 imports searchr1.high.b",
    ])]


def test_packages_of_one_layer_may_not_import_each_other():
    beside = [Import("searchr1/run/x.py", 3, "searchr1.run.x", "searchr1.health.rules")]
    assert layer_violations(beside) == ["searchr1/run/x.py:3 imports searchr1.health.rules: health is beside run"]


def test_the_components_are_the_circles_and_only_them():
    assert components({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}) == [["a", "b", "c"]]


def report(found: list[Import]) -> str:
    """The circles between packages and inside them, with the imports that close them."""
    lines = []
    for title, circles in (("packages", package_circles(found)), ("modules of one package", module_circles(found))):
        lines.append(f"circles between {title}: {len(circles)}")
        for members, edges in circles:
            lines.append(f"  {len(members)}: {', '.join(members)} ({len(edges)} imports)")
            lines.extend(f"    {edge}" for edge in edges)
    lines.append(f"imports against the layers: {len(layer_violations(found))}")
    lines.extend(f"  {line}" for line in layer_violations(found))
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(imports(Path(sys.argv[1]) / "searchr1" if len(sys.argv) > 1 else PACKAGE)))

"""The project's import graph, read from the source (AST): no cycle anywhere, and the layers hold.

Every import counts — at module level, inside a function, under `if TYPE_CHECKING:` or `try:` —
because each one is a dependency a reader has to carry. Relative imports are resolved; `from
package import name` counts as an import of the submodule when `name` is one. The rules:

- no import cycle among the project's modules (engine, charts, pages, ui, app, bench, scripts,
  tests);
- engine is a library: it imports neither streamlit nor charts, pages, ui or app;
- engine's core (the loop, the loader, the record formats) imports only the core: none of the
  subsystems (kernels, kv, quant, serving, remote, lens, timing), nor what sits above them;
- a subsystem never imports the modules above the subsystems (the experiments bundle, the file
  readers, the CLI, the model store);
- charts draws figures: it imports neither streamlit nor pages, ui or app;
- i18n (the catalogs' words) is a leaf: it imports no project module and no streamlit;
- pages and ui never import torch or transformers (the engine does the model work).

Each rule is also fed a small graph that breaks it, so a checker that cannot fail would be seen.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "charts", "i18n", "pages", "ui", "bench", "scripts", "tests")
SKIP = {".venv", "build", "out", "__pycache__"}

ENGINE_CORE = ("engine.errors", "engine.settings", "engine.spec", "engine.loader",
               "engine.forward", "engine.runner", "engine.decoders", "engine.attention", "engine.detok",
               "engine.sampling", "engine.clock", "engine.assets", "engine.records",
               "engine.outfile",
               # reading a GGUF is loading a model (the loader opens a --model PATH.gguf);
               # engine.gguf's export and CLI quantize, so they are a subsystem below
               "engine.gguf.names", "engine.gguf.header", "engine.gguf.table",
               "engine.gguf.reader", "engine.gguf.writer", "engine.gguf.vocab",
               # a GGUF opens memory-mapped and runs on its stored blocks: the map, the
               # matrices multiplied in place and whether the file fits are how it is held
               "engine.gguf.mapped", "engine.gguf.stored", "engine.gguf.fit", "engine.cbuild",
               "engine.cache")
CORE_PACKAGES = ("engine", "engine.gguf")  # package modules in the core (their own code only)
SUBSYSTEMS = tuple(f"engine.{name}" for name in
                   ("kernels", "kv", "quant", "serving", "remote", "lens", "timing",
                    "whatif", "gguf.export", "gguf.cli"))
ENGINE_TOP = ("engine.experiments", "engine.experiments_kv", "engine.experiment_checks",
              "engine.files", "engine.cli_run", "engine.__main__",
              "engine.models",
              # finding the GGUF files here weighs each at the model store's default context
              "engine.gguf.discover", "engine.gguf.models_cli")

Graph = dict[str, set[str]]
Layer = Callable[[str], bool]


def within(*prefixes: str) -> Layer:
    """Whether a module is one of `prefixes` or inside one (by dotted name, not by string:
    "apple" is not inside "app")."""
    return lambda module: any(module == p or module.startswith(p + ".") for p in prefixes)


def core(module: str) -> bool:
    """The engine's core: the package itself (its version and lazy names), engine.gguf's
    package module and ENGINE_CORE."""
    return module in CORE_PACKAGES or within(*ENGINE_CORE)(module)


def project_modules(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every project .py file (app.py included)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIP or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if rel.parts[0] not in PACKAGES and rel.as_posix() != "app.py":
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             known: set[str]) -> list[str]:
    """The dotted names one import statement loads: a project module where one matches (the
    deepest), else the external package's top-level name."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".") if is_package else module.split(".")[:-1]
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    found = []
    for name in names:
        target = name
        while target and target not in known:
            target = target.rpartition(".")[0]
        found.append(target or name.split(".")[0])
    return found


def import_graph(root: Path) -> Graph:
    """module → every module it imports (project modules by full name, others by package)."""
    modules = project_modules(root)
    known = set(modules)
    graph: Graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets.update(_targets(name, path.name == "__init__.py", node, known))
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue  # an external package: no edges out
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


# (who, what it must not import, why): each checked over every edge of the graph
RULES: tuple[tuple[Layer, Layer, str], ...] = (
    (within("engine"), within("streamlit", "charts", "pages", "ui", "app"),
     "the engine is a pure library"),
    (core, within(*SUBSYSTEMS, *ENGINE_TOP), "the engine's core imports only the core"),
    (within(*SUBSYSTEMS), within(*ENGINE_TOP),
     "a subsystem never imports what sits above the subsystems"),
    (within("charts"), within("streamlit", "pages", "ui", "app"),
     "charts draws figures, not the app"),
    (within("pages", "ui"), within("torch", "transformers"),
     "the app's pages leave the model to the engine"),
    (within("i18n"), within("streamlit", "engine", "charts", "pages", "ui", "app"),
     "i18n is a leaf: the words, for every layer that draws"),
)


def broken_rules(graph: Graph) -> list[str]:
    """One line per import that breaks a layering rule."""
    return [f"{module} imports {target}: {why}"
            for module, targets in sorted(graph.items()) for target in sorted(targets)
            for who, forbidden, why in RULES if who(module) and forbidden(target)]


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(ROOT)


def test_the_walker_sees_the_whole_project(graph):
    assert {"app", "engine.runner", "engine.forward", "charts.report", "tests.test_layering"} \
        <= set(graph)
    assert "engine.forward" in graph["engine.runner"] and "torch" in graph["engine.runner"]


def test_no_import_cycle_anywhere(graph):
    assert cycles(graph) == []


def test_every_layering_rule_holds(graph):
    assert broken_rules(graph) == []


# A checker that cannot fail is a defect: each rule and the cycle finder, fed a graph that
# breaks it.

def test_a_cycle_is_found_and_named():
    graph = {"engine.runner": {"engine.kernels.native"},
             "engine.kernels.native": {"engine.quant.variants", "torch"},
             "engine.quant.variants": {"engine.runner"}, "charts.x": {"engine.runner"}}
    assert cycles(graph) == [["engine.kernels.native", "engine.quant.variants", "engine.runner"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("module, target", [
    ("engine.runner", "streamlit"),
    ("engine.kv.cachelab", "charts.kvcache"),
    ("engine.files", "pages.traces"),
    ("engine.models", "ui.state"),
    ("engine.experiments", "app"),
    ("engine.runner", "engine.kernels.native"),
    ("engine.records.tracefile", "engine.experiments"),
    ("engine.forward", "engine.timing.clock"),
    ("engine", "engine.lens.compare"),
    ("engine.quant.study", "engine.experiments"),
    ("engine.kernels.native", "engine.models"),
    ("charts.report", "streamlit"),
    ("charts.attention", "pages.attention"),
    ("charts.live", "ui.session"),
    ("pages.generate", "torch"),
    ("ui.replay", "transformers"),
    ("i18n", "streamlit"),
    ("i18n", "ui.state"),
])
def test_each_rule_break_is_caught(module, target):
    broken = broken_rules({module: {target}, target: set()})
    assert len(broken) == 1 and broken[0].startswith(f"{module} imports {target}:")


@pytest.mark.parametrize("module, target", [
    ("engine.kernels.native", "engine.runner"), ("engine.experiments", "engine.quant.study"),
    ("engine.runner", "engine.records.trace"), ("engine.files", "engine.serving.servingfile"),
    ("charts.report", "engine.files"), ("pages.generate", "charts.live"),
    ("pages.generate", "streamlit"), ("ui.state", "engine.runner"), ("application", "torch"),
    ("engine.quant.study", "engine.kernels.native"),
])
def test_allowed_imports_pass(module, target):
    assert broken_rules({module: {target}, target: set()}) == []


def test_the_walker_counts_every_kind_of_import(tmp_path):
    """Function-level, TYPE_CHECKING and relative imports, and `from package import module`."""
    (tmp_path / "engine" / "kernels").mkdir(parents=True)
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "engine" / "kernels" / "__init__.py").write_text("")
    (tmp_path / "engine" / "kernels" / "native.py").write_text(
        "def later():\n    from ..runner import run\n")
    (tmp_path / "engine" / "runner.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .kernels import native\n")
    (tmp_path / "app.py").write_text("import engine.runner\nimport streamlit as st\n")
    graph = import_graph(tmp_path)
    assert graph["engine.runner"] == {"typing", "engine.kernels.native"}
    assert graph["engine.kernels.native"] == {"engine.runner"}
    assert graph["app"] == {"engine.runner", "streamlit"}
    assert cycles(graph) == [["engine.kernels.native", "engine.runner"]]
    assert broken_rules(graph) == ["engine.runner imports engine.kernels.native: the engine's "
                                   "core imports only the core"]


def test_every_engine_module_sits_in_one_layer(graph):
    """A new engine module is placed in the core, a subsystem or the top, so a rule covers it."""
    layers = (core, within(*SUBSYSTEMS), within(*ENGINE_TOP))
    engine = [m for m in graph if within("engine")(m)]
    assert [m for m in engine if sum(layer(m) for layer in layers) != 1] == []


def test_no_script_shadows_a_package():
    """scripts/streamlit_app.py runs with scripts/ first on sys.path: a script named like a
    package (scripts/i18n.py once) would be imported in its place."""
    scripts = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    assert scripts.isdisjoint({*PACKAGES, "app"}), scripts & {*PACKAGES, "app"}

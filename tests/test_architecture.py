"""The module graph of `rlotel/`: its folders are its layers, and it has no import cycles.

Every import statement counts: imports inside functions (lazy ones) and under
`TYPE_CHECKING` too — a dependency hidden behind either still means a module that cannot
be understood, or changed, without the one it names. `from rlotel import x` is an edge to
the submodule `rlotel.x` when there is one, else to the package (whose `__init__` runs).

Layers, lowest first (`LAYERS`, the map as data), each one or more folders of `rlotel/`
(`""` is the package's own top-level modules): a module may import its own layer and the
layers below it, never one above.

- `base`: leaf utilities every layer uses (errors, the environment reader, ids, the clock,
  counted drops and tallies); they import only each other.
- `schema`: pure data everyone reads, the training thread included (the ledger spells
  `step` through the vocabulary, samples name their span attributes), and verl's formulas.
- `record`: what the training thread writes — the ledger, samples, ranks, NVTX, and the
  record of one profiler capture (steps link captures).
- `derive`: what is computed from records: summaries, verdicts, the stall judgement.
- `publish`: the background pipeline that hands closed steps to the sinks.
- `series`: the backend-neutral series store and the recorder that fills it.
- `sinks`: the exporters (Prometheus, OTLP metrics and traces, the traces file).
- `profile`: the torch.profiler driver that makes captures.
- the package's own modules: the configuration, `Telemetry` that composes the above, the
  public facade (`rlotel/__init__.py`, loading the rest lazily by name, `_LAZY`, checked).
- `offline`: commands that read a run's files (analyze, compare, report, hangs, ...).
- `integrations`, `demo`, `cli`: what plugs rlotel into a host or a person.

A package's `__init__` runs before any of its modules, so a subpackage's `__init__`
imports nothing (checked).
"""

from __future__ import annotations

import ast
from pathlib import Path

import rlotel

PACKAGE = Path(rlotel.__file__).parent

# (layer, its folders) lowest first; "" is the package's own top-level modules.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("base",)),
    ("schema", ("schema",)),
    ("record", ("record",)),
    ("derive", ("derive",)),
    ("publish", ("publish",)),
    ("series", ("series",)),
    ("sinks", ("sinks",)),
    ("profile", ("profile",)),
    ("composition", ("",)),
    ("offline", ("offline",)),
    ("outer", ("integrations", "demo", "cli")),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.append(submodule if submodule in modules else base)
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def folder_of(module: str) -> str:
    """The folder of `rlotel/` a module lives in ("" for the package's own modules; the
    package's `__main__`, `python -m rlotel`, is the command line's entry point)."""
    parts = module.split(".")
    if parts[1:] == ["__main__"]:
        return "cli"
    package_modules = {path.stem for path in PACKAGE.glob("*.py")}
    if len(parts) == 1 or (len(parts) == 2 and parts[1] in package_modules):
        return ""
    return parts[1]


def layer_of(modules: set[str]) -> dict[str, int]:
    """Each module's layer index, from its folder."""
    index = {folder: i for i, (_, folders) in enumerate(LAYERS) for folder in folders}
    return {m: index[folder_of(m)] for m in modules if folder_of(m) in index}


def upward(graph: dict[str, set[str]], layers: dict[str, int]) -> set[tuple[str, str]]:
    """Edges from a module to one in a higher layer."""
    return {(a, b) for a, targets in graph.items() for b in targets if layers[b] > layers[a]}


def render(graph: dict[str, set[str]], layers: dict[str, int]) -> str:
    """The layers in order, each with its modules and the lower layers it imports."""
    lines = []
    for index, (name, _) in enumerate(LAYERS):
        members = sorted(m.removeprefix("rlotel.") for m, i in layers.items() if i == index)
        uses = sorted({layers[b] for m, i in layers.items() if i == index for b in graph[m]})
        used = [LAYERS[i][0] + (" (pending, above)" if i > index else "") for i in uses]
        below = ", ".join(u for i, u in zip(uses, used, strict=True) if i != index) or "-"
        lines.append(f"{index:2} {name:<12} imports [{below}]: {' '.join(members)}")
    return "\n".join(lines)


def test_every_module_has_one_layer_and_every_listed_folder_exists() -> None:
    graph = import_graph()
    layers = layer_of(set(graph))
    assert sorted(set(graph) - set(layers)) == []  # a new folder: give it a layer
    folders = [folder for _, names in LAYERS for folder in names]
    assert len(folders) == len(set(folders))
    assert sorted(f for f in folders if not (PACKAGE / f).is_dir()) == []
    assert {folder_of(m) for m in graph} == set(folders)  # no listed folder is empty


def test_imports_point_down_the_layers() -> None:
    graph = import_graph()
    layers = layer_of(set(graph))
    print("\n" + render(graph, layers))  # pytest -s shows the map
    found = upward(graph, layers)
    assert sorted(found) == []


def test_subpackage_inits_import_nothing_and_the_facade_loads_only_lower_layers() -> None:
    for init in PACKAGE.glob("*/__init__.py"):
        if len(list(init.parent.glob("*.py"))) == 1:
            continue  # a module that is a package only for its data files (report/)
        tree = ast.parse(init.read_text(), str(init))
        imports = [
            ast.unparse(node)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.module != "__future__"
        ]
        assert imports == [], init
    layers = layer_of(set(import_graph()))
    facade = layers["rlotel"]
    assert {m: layers[m] for m in rlotel._LAZY.values() if layers[m] > facade} == {}


def test_the_checker_finds_an_upward_import() -> None:
    graph = {
        "rlotel.record.ledger": {"rlotel.schema.vocabulary"},
        "rlotel.schema.vocabulary": {"rlotel.telemetry"},
    }
    graph["rlotel.telemetry"] = set()
    layers = layer_of(set(graph))
    assert upward(graph, layers) == {("rlotel.schema.vocabulary", "rlotel.telemetry")}


def test_no_import_cycles_anywhere_in_rlotel() -> None:
    graph = import_graph()
    assert len(graph) > 40  # the walk found the package, demo and integrations included
    assert cycles(graph) == []


def test_the_checker_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


if __name__ == "__main__":  # python tests/test_architecture.py: the layer map
    graph = import_graph()
    print(render(graph, layer_of(set(graph))))

"""The import layers of specregen (docs/ARCHITECTURE.md, "Layers"): no import cycle, the command
line on the top floor, the models below every stage, and the layer order of pyproject.toml's
`[tool.importlinter]` contract. Each failure names the imports that break the rule."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from itertools import pairwise
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFECT_SIDE = ("flows", "tasks", "deployments")

# What the models (chat formats) may not import: every stage above them and the top floor.
ABOVE_MODELS = ("client", "pipeline", "emulator", "realserver", "cli", "reconstruct",
                "conversation", "gate", "export", "inspect", "report", "probe", "sources",
                "config", "store", "logprobs")


@cache
def graph() -> grimp.ImportGraph:
    # Every import counts, those inside functions too; no cache (a stale one hides a change).
    return grimp.build_graph("specregen", *PREFECT_SIDE, cache_dir=None)


def line(importer: str, imported: str) -> str:
    details = graph().get_import_details(importer=importer, imported=imported)
    where = ", ".join(f"line {d['line_number']}: {d['line_contents']}" for d in details)
    return f"{importer} -> {imported} ({where})"


def chain_text(chain: tuple[str, ...]) -> str:
    return "\n  ".join(line(a, b) for a, b in pairwise(chain))


def strongly_connected(modules: set[str]) -> list[set[str]]:
    """The module groups that import each other in a circle (Tarjan, iteratively)."""
    g = graph()
    edges = {m: sorted(x for x in g.find_modules_directly_imported_by(m) if x in modules)
             for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return groups


def cycle_through(group: set[str]) -> tuple[str, ...]:
    """One circle through the group's first module: a chain back to where it starts."""
    g = graph()
    first = min(group)
    for nxt in sorted(g.find_modules_directly_imported_by(first)):
        if nxt in group:
            back = g.find_shortest_chain(importer=nxt, imported=first)
            if back:
                return (first, *back)
    return (first,)


def specregen_modules() -> set[str]:
    return {m for m in graph().modules if m == "specregen" or m.startswith("specregen.")}


def test_no_import_cycle_among_modules():
    groups = strongly_connected(specregen_modules())
    message = "\n".join(f"import cycle:\n  {chain_text(cycle_through(g))}" for g in groups)
    assert not groups, message


def test_no_library_module_imports_the_command_line_or_the_prefect_side():
    g = graph()
    top_floor = {m for m in specregen_modules()
                 if m == "specregen.__main__" or m == "specregen.cli"
                 or m.startswith("specregen.cli.")}
    bad = []
    for module in sorted(specregen_modules() - top_floor):
        for imported in sorted(g.find_modules_directly_imported_by(module)):
            package = imported.split(".")[0]
            if (imported == "specregen.cli" or imported.startswith("specregen.cli.")
                    or package in PREFECT_SIDE):
                bad.append(line(module, imported))
    assert not bad, "library modules importing the top floor:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("layer", ABOVE_MODELS)
def test_models_import_nothing_above_them(layer):
    chain = graph().find_shortest_chain(importer="specregen.models",
                                        imported=f"specregen.{layer}", as_packages=True)
    assert chain is None, f"specregen.models reaches specregen.{layer}:\n  {chain_text(chain)}"


def test_every_top_level_module_has_a_layer():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers"]
    named = {part.strip() for layer in contract["layers"]
             for part in layer.replace("|", ":").split(":")}
    tops = {m.split(".")[1] for m in specregen_modules() if m != "specregen"}
    assert not tops - named, f"put these in a layer of [tool.importlinter]: {tops - named}"
    assert not named - tops, f"these layers name no module: {named - tops}"


def test_the_layers_contract_holds():
    # In its own process: import-linter's command configures logging (`dictConfig`), which
    # would disable every logger this test session has made.
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports;"
         " sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True,"
         " no_logo=True))"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    # Its report names each import that goes up a layer, with the chain that leads there.
    assert done.returncode == 0, done.stdout + done.stderr

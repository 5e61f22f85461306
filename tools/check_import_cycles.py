"""No import cycle anywhere in the ROSE packages, module to module: package ``__init__`` files, imports inside
functions and ``TYPE_CHECKING`` imports included. import-linter's ``acyclic_siblings`` contract sees cycles
between siblings only; this sees every one. It uses grimp, the graph library under import-linter.

    PYTHONPATH=packages/rose-core/src:... python tools/check_import_cycles.py      (`nox -s lint` runs it)

Prints each cycle as a chain and exits 1, or prints the counts and exits 0.
"""

from __future__ import annotations

import sys

import grimp

PACKAGES = ("rose_core", "rose_transfer", "rose_executor", "rose_tui")


def cycles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """One chain per import ``a -> b`` that ``b`` leads back from to ``a`` (each cycle once, by its members)."""
    found: dict[frozenset[str], tuple[str, ...]] = {}
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                found.setdefault(frozenset(back), (importer, *back))
    return list(found.values())


def main() -> int:
    graph = grimp.build_graph(*PACKAGES)
    found = cycles(graph)
    for chain in found:
        print("import cycle: " + " -> ".join(chain))
    print(f"{len(graph.modules)} modules, {graph.count_imports()} imports, {len(found)} import cycles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

"""Draw rl_gap's imports: rooms with line counts, module circles, arrows running back up.

Reads the package with ``ast`` only (nothing is imported), so it runs on any checkout:

    python tools/import_graph.py            # this tree's rl_gap/
    python tools/import_graph.py --root /path/to/checkout

A room is a subpackage of ``rl_gap`` (``rl_gap/metrics/tail/`` is the room ``metrics.tail``)
or a root module (``rl_gap/optim.py`` is ``optim``). An arrow ``a -> b`` is a room importing
another; it runs *back up* when ``b`` sits on a higher floor than ``a`` in ``FLOORS``. Every
import counts: those inside functions, and those under ``if TYPE_CHECKING:`` (they never run,
but they are the design's dependencies: a loop drawn only in type hints is still a loop).
A circle is a strongly connected set of two or more modules.

``--known ROOM`` reports the circles lying wholly inside ROOM on their own line and leaves
them out of the exit status (a room under rework); every other circle fails.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

# Floors, lowest first: a room may import rooms on its own floor or below.
FLOORS: list[tuple[str, ...]] = [
    ("__init__", "dist", "precision", "native_build", "resources", "lazy"),
    (
        "losses",
        "losses.fast_sap",
        "losses.sharding",
        "metrics",
        "metrics.functional",
        "metrics.tail",
    ),
    ("optim", "models"),
    ("data",),
    # Callbacks read metrics only; a module attaches its default callbacks (configure_callbacks).
    ("callbacks",),
    ("modules",),
    ("training",),
    # The help record is read by cli (replay before any heavy import), never the reverse.
    ("experiments", "commands", "help_spec"),
    ("cli", "demo"),
    ("recipes",),
]


def module_name(path: Path, pkg_root: Path) -> str:
    rel = path.relative_to(pkg_root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def room_of(module: str, packages: set[str]) -> str:
    """The deepest subpackage holding ``module`` below rl_gap (or the root module's name)."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    for depth in range(len(parts), 0, -1):
        candidate = "rl_gap." + ".".join(parts[:depth])
        if candidate in packages and (depth < len(parts) or candidate == module):
            return ".".join(parts[:depth])
    return parts[0]


def imports_of(path: Path, module: str, modules: set[str], is_pkg: bool) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "rl_gap":
                    found.add(_resolve(alias.name, modules))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module if is_pkg else module.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rsplit(".", 1)[0]
                base = f"{pkg}.{base}" if base else pkg
            if base.split(".")[0] != "rl_gap":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else _resolve(base, modules))
    found.discard(module)
    return found


def _resolve(name: str, modules: set[str]) -> str:
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument(
        "--place",
        action="append",
        default=[],
        metavar="ROOM=FLOOR",
        help="put a room on a floor (index into FLOORS), e.g. for an older tree's root modules",
    )
    parser.add_argument(
        "--known",
        action="append",
        default=[],
        metavar="ROOM",
        help="report circles wholly inside ROOM separately; they do not fail the check",
    )
    args = parser.parse_args(argv)
    floors = [list(rooms) for rooms in FLOORS]
    for item in args.place:
        room, _, where = item.partition("=")
        if not where.isdigit() or int(where) >= len(floors):
            parser.error(
                f"--place wants ROOM=FLOOR with FLOOR in 0..{len(floors) - 1}, got {item!r}"
            )
        floors[int(where)].append(room)
    pkg_root = args.root / "rl_gap"
    if not (pkg_root / "__init__.py").is_file():
        parser.error(f"no rl_gap package under {args.root}")
    files = sorted(p for p in pkg_root.rglob("*.py") if "__pycache__" not in p.parts)
    names = {module_name(p, pkg_root): p for p in files}
    modules = set(names)
    packages = {m for m, p in names.items() if p.name == "__init__.py"}
    graph = {m: imports_of(p, m, modules, p.name == "__init__.py") for m, p in names.items()}

    floor = {room: i for i, rooms in enumerate(floors) for room in rooms}
    lines: dict[str, int] = defaultdict(int)
    nfiles: dict[str, int] = defaultdict(int)
    for m, p in names.items():
        room = room_of(m, packages)
        lines[room] += len(p.read_text().splitlines())
        nfiles[room] += 1

    total = sum(lines.values())
    print(f"rl_gap: {total} lines in {len(files)} files, {len(lines)} rooms")
    print(f"{'room':<22} {'floor':>5} {'files':>5} {'lines':>6}")
    for room in sorted(lines, key=lambda r: (floor.get(r, 99), r)):
        where = floor.get(room, "?")
        print(f"{room:<22} {where!s:>5} {nfiles[room]:>5} {lines[room]:>6}")

    def known(comp: list[str], rooms_of) -> bool:
        return any(all(rooms_of(c) == room for c in comp) for room in args.known)

    found = strongly_connected(graph)
    circles = [c for c in found if not known(c, lambda m: room_of(m, packages))]
    print(f"\nimport circles between modules: {len(circles)}")
    for comp in circles:
        print("  " + " <-> ".join(c.removeprefix("rl_gap.") for c in comp))
    for room in args.known:
        inside = [c for c in found if all(room_of(m, packages) == room for m in c)]
        print(f"import circles inside {room} (known, not counted): {len(inside)}")
        for comp in inside:
            print("  " + " <-> ".join(c.removeprefix("rl_gap.") for c in comp))

    unplaced = sorted(r for r in lines if r not in floor)
    up: list[str] = []
    for m, targets in sorted(graph.items()):
        a = room_of(m, packages)
        for t in sorted(targets):
            b = room_of(t, packages)
            if a != b and a in floor and b in floor and floor[b] > floor[a]:
                up.append(
                    f"  {m.removeprefix('rl_gap.')} ({a}) -> {t.removeprefix('rl_gap.')} ({b})"
                )
    print(f"\narrows running back up between rooms: {len(up)}")
    print("\n".join(up))
    if unplaced:
        print(f"\nrooms on no floor (add them to FLOORS): {', '.join(unplaced)}")
    return 1 if circles or up or unplaced else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""No import circle in orchestrator/ or jobs/: a module that needs another's name imports it; two that need
each other are one idea in two files (or a third module is missing). Function-level imports count too: they
defer a cycle, they do not remove it (imports under `if TYPE_CHECKING:` do not run, so they do not count)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "jobs")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules `name` imports anywhere in its file; `from pkg import sub` names the submodule."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name}


def _runtime_nodes(tree: ast.AST):
    """Every node but those under `if TYPE_CHECKING:` (imports for annotations only never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            kids = node.orelse
        else:
            kids = [node]
        for n in kids:
            yield n
            yield from _runtime_nodes(n)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_orchestrator_or_jobs():
    known = modules()
    graph = {m: imports(m, p, known) for m, p in known.items()}
    assert cycles(graph) == []

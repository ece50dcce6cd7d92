"""No import circle among the library's modules (issue 20): every import, lazy ones and those
for annotations included, as import-linter's ``acyclic_siblings`` contract counts them."""

import ast
from pathlib import Path

import fedlatent

ROOT = Path(fedlatent.__file__).parent


def _graph() -> dict[str, set[str]]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if pkg else parts)] = (p, pkg)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, (p, pkg) in mods.items():
        here = m if pkg else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here.split(".")[:len(here.split(".")) - node.level + 1] if node.level \
                    else []
                target = ".".join(base + ([node.module] if node.module else []))
                names = [f"{target}.{a.name}" for a in node.names]
                names += [target] if node.module else []
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph[m] |= {t for t in names if t in mods and t != m}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


def test_the_graph_sees_the_imports_it_must():
    g = _graph()
    assert "fedlatent.engine.faults" in g["fedlatent.engine.rounds.loop"]
    assert "fedlatent.data.client" in g["fedlatent.data.frame"]  # a lazy import


def test_no_module_of_the_library_imports_another_in_a_circle():
    assert _circles(_graph()) == []


def test_a_circle_is_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_fit_errors_are_one_class_wherever_imported():
    from fedlatent.engine import FederatedFitError, faults
    from fedlatent.engine.rounds import loop

    assert loop.FederatedFitError is faults.FederatedFitError is FederatedFitError
    assert issubclass(loop.ServerStepError, FederatedFitError)

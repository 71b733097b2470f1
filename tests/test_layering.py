"""The packages are a rank table, and no two files import each other, not even inside functions.

Every import counts, wherever it is written (at the top, inside a function, under
`if TYPE_CHECKING`): an import inside a function runs later, but the dependency
is the same, and a cycle of them is still a knot a newcomer must untie first.
"""

import ast
import collections
import pathlib

_REPO = pathlib.Path(__file__).resolve().parent.parent

# A package imports only packages of a lower rank; imaging and readers share one and never
# import each other (docs/architecture.md, "The layers").
_RANKS = {"compat": 0, "schemas": 1, "imaging": 2, "readers": 2, "conversion": 3, "beam_jobs": 4,
          "shardsmith": 5}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package in _RANKS:
        for path in sorted((_REPO / package).rglob("*.py")):
            parts = list(path.relative_to(_REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(module: str, path: pathlib.Path, modules) -> list[tuple[str, int]]:
    """(first-party module, line) of every import of the file, inside functions too."""
    def resolve(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            # `from package import module` depends on the module; `from package import name`
            # on the package's __init__, which defines or re-exports the name.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            target = resolve(name)
            if target and target != module:
                found.append((target, node.lineno))
    return found


def _graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    graph = {m: {} for m in modules}
    for module, path in modules.items():
        for target, line in _imports(module, path, modules):
            graph[module].setdefault(target, line)
    return graph


def cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
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
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_the_cycle_finder_finds_cycles_through_any_length():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_imports_are_seen_inside_functions_too():
    graph = _graph()
    # conversion.guard's readers of files are imported inside functions only.
    assert "conversion.files" in graph["conversion.guard"]
    assert sum(len(targets) for targets in graph.values()) > 300, "the imports were found"


def test_from_a_package_import_a_module_is_an_edge_to_that_module():
    graph = _graph()
    # `from conversion import guard, processes as _processes, recovery` (conversion.shard_maker).
    assert {"conversion.guard", "conversion.processes", "conversion.recovery"} <= set(graph["conversion.shard_maker"])
    # ... and a name a package defines or re-exports is an edge to its __init__.
    assert "conversion.examples" in graph["conversion.shard_maker"]  # `from conversion.examples import warm_call`


def test_every_package_imports_only_those_of_a_lower_rank():
    wrong = []
    for module, targets in sorted(_graph().items()):
        package = module.split(".")[0]
        for target, line in sorted(targets.items()):
            other = target.split(".")[0]
            if other != package and _RANKS[other] >= _RANKS[package]:
                wrong.append(f"{module}:{line} imports {target} ({other} is not below {package})")
    assert wrong == [], wrong


def test_no_file_cycle_counting_imports_inside_functions():
    assert cycles(_graph()) == []


def test_tests_import_their_helpers_by_plain_name():
    """`tests` is a namespace package: a third-party wheel that ships a top-level `tests` package
    (rt-utils does) wins over it, and `tests.helpers` stops importing in a fresh venv. Test files
    import `helpers`, `_reader_data`, ... by plain name (pytest puts tests/ on sys.path)."""
    found = []
    for path in sorted((_REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.name}:{node.lineno}" for n in names if n == "tests" or n.startswith("tests.")]
    assert found == []

"""The package as Dataflow workers get it: `--setup_file ./setup.py`.

Beam's stager builds a source distribution of the folder holding setup.py and
workers `pip install` it; nothing else of the checkout reaches them. These
tests build it the same way (Beam's own stager function, in a copy of the
checkout) and check that every module of the worker packages is inside, that
every third-party import is declared as a requirement, and that nothing
depends on `--save_main_session`.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import shutil
import sys
import tarfile

import pytest
from apache_beam.runners.portability.stager import Stager

_REPO = pathlib.Path(__file__).resolve().parent.parent
# The packages setup.py installs, which the pipelines' workers import.
_PACKAGES = ("schemas", "imaging", "conversion", "beam_jobs", "readers", "shardsmith", "compat")
# Distributions that install the `tensorflow` package: one TensorFlow build each.
_TF_FLAVOURS = {"tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos",
                "tf-nightly", "tf-nightly-cpu"}
# The extras that pick a TensorFlow build (setup.py: TensorFlow is brought by
# the user or by one of these).
_TF_EXTRAS = ("cpu", "gpu")
# Beam transforms whose first argument is user code pickled to the workers.
_USER_CODE_TRANSFORMS = {
    "Map", "FlatMap", "Filter", "ParDo", "MapTuple", "FlatMapTuple", "CombineGlobally",
    "CombinePerKey", "CombineValues", "Partition",
}


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> tarfile.TarFile:
    """The tarball Beam stages as workflow.tar.gz for `--setup_file setup.py`."""
    copy = tmp_path_factory.mktemp("checkout") / "shardsmith"
    # Without what the tests themselves write into the checkout while they run (`.hypothesis`:
    # Hypothesis's database, written by other test modules, possibly at the same time under
    # pytest-xdist; a file renamed away mid-copy would fail the copy).
    shutil.copytree(_REPO, copy, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
        ".hypothesis",
    ))
    out = tmp_path_factory.mktemp("staged")
    # Beam's stager runs `python -m build --sdist --no-isolation` when the
    # `build` module is installed, else `python setup.py sdist`; both in the
    # folder of setup.py.
    tarball = Stager._build_setup_package(str(copy / "setup.py"), str(out))
    with tarfile.open(tarball) as tar:
        yield tar


def _sdist_files(tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """{path inside the project: member}, without the 'shardsmith-X.Y/' prefix."""
    return {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name and m.isfile()}


def _modules(root: pathlib.Path = _REPO) -> dict[str, pathlib.Path]:
    """{dotted module name: file} of every module of the worker packages."""
    found = {}
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


@functools.lru_cache(maxsize=None)
def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _imports(tree: ast.Module, module: str, *, top_level_only: bool):
    """(imported dotted name, line) of each absolute import; relative ones resolved.

    With `top_level_only`, only imports that run when the module is imported:
    not those inside functions, classes or `if TYPE_CHECKING:`.
    """
    def visit(node):
        for child in ast.iter_child_nodes(node):
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if top_level_only and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module.split(".")
                    if not _is_package(module):
                        package = package[:-1]
                    package = package[: len(package) - (child.level - 1)]
                    base = ".".join([*package, base] if base else package)
                for alias in child.names:
                    yield f"{base}.{alias.name}", child.lineno
            else:
                yield from visit(child)

    yield from visit(tree)


def _is_package(module: str) -> bool:
    return _modules()[module].name == "__init__.py"


def _first_party_module(name: str) -> str | None:
    """The worker module `name` (or `name` minus an attribute) refers to, if any."""
    modules = _modules()
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _entry_modules() -> set[str]:
    """Modules imported first: packages, `python -m` modules, console scripts."""
    entries = {m for m in _modules() if _is_package(m)}
    for module, path in _modules().items():
        if re.search(r"^if __name__ == .__main__.:", path.read_text(encoding="utf-8"), re.M):
            entries.add(module)
    setup = (_REPO / "setup.py").read_text(encoding="utf-8")
    entries.update(re.findall(r"=\s*([\w.]+):\w+", setup))
    return entries


def _loaded_on_import() -> set[str]:
    """Worker modules that importing the entry modules loads (top-level imports)."""
    loaded, todo = set(), list(_entry_modules())
    while todo:
        module = todo.pop()
        if module in loaded:
            continue
        loaded.add(module)
        # Importing a.b.c imports a and a.b first.
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        for name, _ in _imports(_tree(_modules()[module]), module, top_level_only=True):
            target = _first_party_module(name)
            if target:
                todo.append(target)
    return loaded


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(tar: tarfile.TarFile) -> tuple[set[str], dict[str, set[str]]]:
    """(install_requires, {extra: requirements}) as canonical distribution names."""
    files = _sdist_files(tar)
    requires = next(m for n, m in files.items() if n.endswith(".egg-info/requires.txt"))
    core: set[str] = set()
    extras: dict[str, set[str]] = {}
    section: set[str] = core
    for line in tar.extractfile(requires).read().decode().splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("["):
            extra = line[1:-1].split(":", 1)[0]
            section = extras.setdefault(extra, set()) if extra else core  # "[:marker]" is core.
            continue
        section.add(_canonical(re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0]))
    return core, extras


@functools.lru_cache(maxsize=None)
def _owners() -> dict[str, set[str]]:
    """{real path of an installed top-level module or package: its distributions}."""
    owners: dict[str, set[str]] = {}
    for dist in importlib.metadata.distributions():
        for f in dist.files or ():
            if len(f.parts) <= 3 and (f.name == "__init__.py" or (len(f.parts) == 1 and f.suffix == ".py")):
                path = os.path.realpath(dist.locate_file(f))
                owners.setdefault(path, set()).add(_canonical(dist.metadata["Name"]))
    return owners


def _distributions_of(name: str) -> set[str]:
    """The installed distributions that provide the module `name` (not imported)."""
    parts = name.split(".")
    spec = importlib.util.find_spec(parts[0])
    if spec is None:
        return set()
    if spec.origin in (None, "namespace") and len(parts) > 1:  # e.g. google.protobuf
        for location in spec.submodule_search_locations:
            for candidate in (pathlib.Path(location, parts[1], "__init__.py"),
                              pathlib.Path(location, parts[1] + ".py")):
                if candidate.exists():
                    return _owners().get(os.path.realpath(candidate), set())
        return set()
    return _owners().get(os.path.realpath(spec.origin), set()) if spec.origin else set()


def test_sdist_holds_every_worker_module(sdist):
    files = _sdist_files(sdist)
    missing = [
        str(path.relative_to(_REPO)) for path in _modules().values()
        if str(path.relative_to(_REPO)) not in files
    ]
    assert missing == [], f"modules left out of the staged package: {missing}"
    assert "setup.py" in files
    # Nothing the worker modules import comes from elsewhere in the checkout
    # (bench/, tests/, a script at the root): it would not reach the workers.
    local = {p.stem if p.suffix == ".py" else p.name for p in _REPO.iterdir()
             if p.suffix == ".py" or (p / "__init__.py").exists()} - set(_PACKAGES) - {"setup"}
    stray = [
        f"{module}: {name} (line {line})"
        for module, path in _modules().items()
        for name, line in _imports(_tree(path), module, top_level_only=False)
        if name.split(".")[0] in local
    ]
    assert stray == [], f"worker modules import code that is not packaged: {stray}"


def test_third_party_imports_are_declared(sdist):
    core, extras = _requirements(sdist)
    optional = set().union(*extras.values())
    loaded = _loaded_on_import()
    problems = []
    for module, path in _modules().items():
        eager = {(n, line) for n, line in _imports(_tree(path), module, top_level_only=True)}
        seen = set()
        for name, line in _imports(_tree(path), module, top_level_only=False):
            top = name.split(".")[0]
            if top in _PACKAGES or top in sys.stdlib_module_names or top == "__future__":
                continue
            if (top, (name, line) in eager) in seen:
                continue  # One line per distribution and kind of import is enough.
            seen.add((top, (name, line) in eager))
            owners = _distributions_of(name) or {_canonical(top)}
            where = f"{path.relative_to(_REPO)}:{line} imports {name} (from {sorted(owners)})"
            if owners & _TF_FLAVOURS:
                # Required but deliberately not core: every TensorFlow extra brings a build.
                lacking = [e for e in _TF_EXTRAS if not extras.get(e, set()) & _TF_FLAVOURS]
                if lacking:
                    problems.append(f"{where}: no TensorFlow build in the extras {lacking}")
            elif module in loaded and (name, line) in eager:
                # Imported whenever a worker imports shardsmith: a core requirement.
                if not owners & core:
                    problems.append(f"{where}: not in install_requires {sorted(core)}")
            elif not owners & (core | optional):
                problems.append(f"{where}: in neither install_requires nor an extra {sorted(extras)}")
    assert problems == [], "\n".join(problems)


def _hands_over_to_importable_module(tree: ast.Module) -> bool:
    """Whether `if __name__ == "__main__":` comes before any def or class.

    Such a module, run with `python -m`, can import itself under its real name
    and run from there before defining anything in `__main__`.
    """
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False
        if isinstance(node, ast.If) and re.fullmatch(
            r"__name__ == ['\"]__main__['\"]", ast.unparse(node.test)
        ):
            return True
    return False


def test_no_save_main_session_reliance():
    """Workers never need the launching script's globals.

    `python -m beam_jobs.X` runs that module as `__main__`; a DoFn (or a
    function given to Map, FlatMap, ...) defined there is pickled by value and
    the element types it makes are looked up in the worker's own `__main__`,
    which fails on Dataflow and with multi-process runners unless the main
    session is saved. Such code belongs in an importable module (as
    `beam_jobs/_shards.py` does for the conversion).
    """
    uses = [
        f"{path.relative_to(_REPO)}:{n}"
        for path in [*_modules().values(), _REPO / "setup.py", _REPO / "Makefile"]
        for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "save_main_session" in text
    ]
    assert uses == [], f"save_main_session is set: {uses}"
    problems = {}
    for module in sorted(_entry_modules() - {m for m in _modules() if _is_package(m)}):
        tree = _tree(_modules()[module])
        if _hands_over_to_importable_module(tree):
            continue
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                ast.unparse(b).split(".")[-1] == "DoFn" for b in node.bases
            ):
                problems.setdefault(node.name, f"{module}: DoFn {node.name} (line {node.lineno})")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and node.args
                    and ast.unparse(node.func).split(".")[-1] in _USER_CODE_TRANSFORMS):
                first = node.args[0]
                target = first.func if isinstance(first, ast.Call) else first
                if isinstance(target, ast.Name) and target.id in defined:
                    problems.setdefault(target.id, f"{module}: {target.id} given to "
                                        f"{ast.unparse(node.func)} (line {node.lineno})")
    problems = sorted(problems.values())
    assert problems == [], (
        "pipeline code defined in a module that runs as __main__ (python -m); move it to an "
        f"importable module: {problems}"
    )


def _requirement_lines(tar: tarfile.TarFile) -> list[tuple[str, str, "Requirement"]]:
    """(extra or '', section marker or '', requirement) of each line of requires.txt."""
    from packaging.requirements import Requirement

    files = _sdist_files(tar)
    requires = next(m for n, m in files.items() if n.endswith(".egg-info/requires.txt"))
    out, extra, marker = [], "", ""
    for line in tar.extractfile(requires).read().decode().splitlines():
        line = line.strip()
        if line.startswith("["):
            extra, _, marker = line[1:-1].partition(":")
        elif line:
            out.append((extra, marker, Requirement(line)))
    return out


def _flavours_installed(lines, extras: tuple[str, ...], machine: str, system: str) -> set[str]:
    """The TensorFlow builds `pip install 'shardsmith[extras]'` puts on such a machine."""
    from packaging.markers import Marker

    env = {"platform_machine": machine, "platform_system": system,
           "sys_platform": system.lower()}
    return {
        _canonical(req.name) for extra, marker, req in lines
        if (extra == "" or extra in extras) and _canonical(req.name) in _TF_FLAVOURS
        and (not marker or Marker(marker).evaluate(env))
    }


def test_no_tensorflow_build_is_forced_and_each_extra_picks_one(sdist):
    lines = _requirement_lines(sdist)
    machines = [("x86_64", "Linux"), ("aarch64", "Linux"), ("arm64", "Darwin"), ("AMD64", "Windows")]
    for machine, system in machines:
        # A GPU trainer's `pip install shardsmith` keeps the TensorFlow it has.
        assert _flavours_installed(lines, (), machine, system) == set(), machine
        assert len(_flavours_installed(lines, ("cpu",), machine, system)) == 1, machine
    assert _flavours_installed(lines, ("cpu",), "x86_64", "Linux") == {"tensorflow-cpu"}
    gpu = [req for extra, _, req in lines if extra == "gpu"]
    assert [(r.name, sorted(r.extras)) for r in gpu if r.name.startswith("tensorflow")] == [
        ("tensorflow", ["and-cuda"])]
    # With the TensorFlow they pick, both extras keep ml_dtypes below 0.7 (its import costs
    # 1.4-1.9 s of CPU in every process: setup.py says why).
    for extra in ("cpu", "gpu"):
        (dtypes,) = [req for e, _, req in lines if e == extra and _canonical(req.name) == "ml-dtypes"]
        assert not dtypes.specifier.contains("0.7.0") and dtypes.specifier.contains("0.6.0"), extra
    # What `make` installs for development and CI: the CPU build alone.
    makefile = (_REPO / "Makefile").read_text(encoding="utf-8")
    make_extras = tuple(re.search(r"^EXTRAS \?= (.+)$", makefile, re.M).group(1).split(","))
    assert _flavours_installed(lines, make_extras, "x86_64", "Linux") == {"tensorflow-cpu"}


def test_libraries_with_private_internals_are_bounded_to_the_tested_releases(sdist):
    # compat/ checks the same ranges at use; the declared ones must not allow more.
    from compat import beam_internals, tf_internals

    lines = _requirement_lines(sdist)
    by_name = {}
    for _, _, req in lines:
        by_name.setdefault(_canonical(req.name), []).append(req)
    for name, first_untested in (("apache-beam", beam_internals.TESTED[1]),
                                 ("tensorflow", tf_internals.TESTED[1]),
                                 ("tensorflow-cpu", tf_internals.TESTED[1]),
                                 ("pydicom", "3.1")):
        for req in by_name[name]:
            assert not req.specifier.contains(first_untested, prereleases=True), (name, str(req))
            assert any(s.operator == "<" for s in req.specifier), (name, str(req))



def test_without_tensorflow_the_first_use_says_what_to_install():
    # TensorFlow is not installed from setup.py's core requirements: a machine
    # without any build gets one sentence, at `import readers` (its first use).
    import subprocess

    code = ("import sys\n"
            "sys.modules['tensorflow'] = None\n"  # As if no TensorFlow were installed.
            "import shardsmith, beam_jobs, imaging, schemas\n"  # Not needed to import these.
            "try:\n"
            "    import readers\n"
            "except ModuleNotFoundError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=_REPO, check=True).stdout
    assert "shardsmith needs TensorFlow" in out and "tensorflow-cpu" in out
    assert "tensorflow[and-cuda]" in out


def test_imports_go_down_the_layers():
    """The command sits on top: no library package imports `shardsmith`; `conversion` imports no Beam
    at its top level and nothing of `beam_jobs`; every module of `beam_jobs` uses Beam."""
    below_the_command = ("schemas", "imaging", "conversion", "beam_jobs", "readers", "compat")
    upward, beam_in_conversion, beam_free = [], [], []
    for module, path in _modules().items():
        package = module.split(".")[0]
        everywhere = list(_imports(_tree(path), module, top_level_only=False))
        for name, line in everywhere:
            top = name.split(".")[0]
            if package in below_the_command and top == "shardsmith":
                upward.append(f"{module}:{line} imports {name}")
            if package == "conversion" and top == "beam_jobs":
                upward.append(f"{module}:{line} imports {name}")
        if package == "conversion":
            beam_in_conversion += [f"{module}:{line} imports {name}"
                                   for name, line in _imports(_tree(path), module, top_level_only=True)
                                   if name.split(".")[0] == "apache_beam"]
        if package == "beam_jobs" and module != "beam_jobs" and not any(
                name.split(".")[0] == "apache_beam" for name, _ in everywhere):
            beam_free.append(module)
    assert upward == [], upward
    assert beam_in_conversion == [], beam_in_conversion
    assert beam_free == [], f"Beam-free modules belong in conversion/: {beam_free}"

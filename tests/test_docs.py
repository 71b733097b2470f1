"""The docs are true: README.md and docs/ say what the code does.

Checked here (docs/architecture.md, "The docs and their test", says the same to contributors):

- every module of the library packages has a row in docs/architecture.md, every module named
  there exists, and every import between the packages is one the page's table allows;
- every `shardsmith ...` (or `python -m beam_jobs.convert|verify ...`) line in a ```sh block
  parses with the real argument parsers, without touching the filesystem;
- the option tables list every flag of the commands and every argument of the reader, with the
  parsers' defaults where they give one in backticks; every reject and skip reason is documented;
- every Python example marked runnable (`<!-- runnable -->` on the line before its ```python
  fence) runs against the demo dataset (`bench.corpus demo`, converted by the real pipeline as
  `make demo` converts it), all of them in one child process;
- every relative link resolves to a file, and every `#anchor` to a heading of its page;
- the README fits on a page and shows `make demo` and `make test` on its first screen.
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import dataclasses
import inspect
import io
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

_REPO = pathlib.Path(__file__).resolve().parent.parent
_DOCS = _REPO / "docs"
_README = _REPO / "README.md"
_ARCHITECTURE = _DOCS / "architecture.md"
_PAGES = (_README, *sorted(_DOCS.rglob("*.md")))
# The packages setup.py installs, in the order of their rank (docs/architecture.md).
_PACKAGES = ("compat", "schemas", "imaging", "readers", "conversion", "beam_jobs", "shardsmith")
_RUNNABLE = "<!-- runnable -->"
_SHELL_LANGUAGES = ("sh", "bash", "shell", "console")
# Folders and files of the repository that the docs may name in backticks; each must exist.
_REPO_PATH = re.compile(
    r"`((?:compat|schemas|imaging|readers|conversion|beam_jobs|shardsmith|tests|bench|devtools|docs)"
    r"/[\w./-]+)`")
_README_MAX_LINES = 250
# The README's first screen: the two commands for a fresh machine must be on it.
_FIRST_SCREEN_LINES = 40
# The demo, as `make demo` converts it (Makefile, `demo:`).
_DEMO_SPLIT = "train=0.8,validation=0.2"
# Seconds for every runnable example together (they take ~30 s on 2 shared cores).
_EXAMPLES_TIMEOUT = 400


# ---------------------------------------------------------------------------
# Reading Markdown: fenced blocks, prose, headings, tables.


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    page: pathlib.Path
    line: int  # 1-based line of the opening fence.
    language: str
    text: str
    before: str  # The line just before the opening fence, stripped.

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(_REPO)}:{self.line}"


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$")


@dataclasses.dataclass(frozen=True)
class Page:
    """A Markdown page: its fenced blocks, and its prose with every block blanked out."""

    path: pathlib.Path
    blocks: tuple[Block, ...]
    prose: tuple[str, ...]  # One entry per line; "" where a block was.


def _read_page(path: pathlib.Path) -> Page:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, prose = [], []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            prose.append(lines[i])
            i += 1
            continue
        indent, fence, language = len(match.group(1)), match.group(2), match.group(3)
        close = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body = []
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            line = lines[j]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            j += 1
        assert j < len(lines), f"{path.relative_to(_REPO)}:{i + 1}: a code block that never closes"
        before = lines[i - 1].strip() if i else ""
        blocks.append(Block(path, i + 1, language, "\n".join(body) + "\n", before))
        prose.extend([""] * (j - i + 1))
        i = j + 1
    return Page(path, tuple(blocks), tuple(prose))


_PAGE_CACHE: dict[pathlib.Path, Page] = {}


def _page(path: pathlib.Path) -> Page:
    path = path.resolve()
    if path not in _PAGE_CACHE:
        _PAGE_CACHE[path] = _read_page(path)
    return _PAGE_CACHE[path]


_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _headings(path: pathlib.Path) -> list[tuple[int, int, str]]:
    """(line, level, text) of every heading outside code blocks."""
    out = []
    for number, line in enumerate(_page(path).prose, 1):
        match = _HEADING.match(line)
        if match:
            out.append((number, len(match.group(1)), match.group(2)))
    return out


def _slug(heading: str) -> str:
    """The anchor a code host (GitHub) gives a heading."""
    text = _LINK.sub(lambda m: m.group(1), heading)  # A link's text, not its address.
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)  # Punctuation goes, backticks included; `_` stays.
    return text.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
    seen: collections.Counter = collections.Counter()
    anchors = set()
    for _, _, text in _headings(path):
        slug = _slug(text)
        anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return anchors


def _tables(path: pathlib.Path, heading: str) -> list[list[list[str]]]:
    """The tables in the section under `heading` (up to the next heading), as rows of cells.

    The header row comes first; the delimiter row (`| --- |`) is left out.
    """
    prose = _page(path).prose
    starts = [line for line, _, text in _headings(path) if text == heading]
    assert starts, f"{path.relative_to(_REPO)} has no heading {heading!r}"
    tables, table = [], []
    for line in prose[starts[0]:]:
        if _HEADING.match(line):
            break
        if line.lstrip().startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
                table.append(cells)
        elif table:
            tables.append(table)
            table = []
    if table:
        tables.append(table)
    return tables


def _table_with(path: pathlib.Path, heading: str, first_column: str) -> list[list[str]]:
    """The rows (without the header) of the table under `heading` whose first column is `first_column`."""
    for table in _tables(path, heading):
        if table[0][0] == first_column:
            return table[1:]
    raise AssertionError(f"{path.relative_to(_REPO)}, {heading!r}: no table whose first column is "
                         f"{first_column!r}")


def _code_spans(cell: str) -> list[str]:
    return [m.group(2).strip() for m in _CODE_SPAN.finditer(cell)]


def _all_blocks() -> list[Block]:
    return [block for path in _PAGES for block in _page(path).blocks]


# ---------------------------------------------------------------------------
# The README.


def test_the_readme_fits_on_a_page_with_both_commands_on_its_first_screen():
    lines = _README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= _README_MAX_LINES, f"README.md has {len(lines)} lines: at most {_README_MAX_LINES}"
    first = [b for b in _page(_README).blocks if b.language in _SHELL_LANGUAGES and b.line <= _FIRST_SCREEN_LINES]
    commands = {line.split("#")[0].strip() for b in first for line in b.text.splitlines()}
    assert {"make demo", "make test"} <= commands, (
        f"make demo and make test belong in a ```sh block in the README's first {_FIRST_SCREEN_LINES} lines")


def test_every_docs_page_is_linked_from_the_index():
    index = _DOCS / "README.md"
    linked = {(index.parent / target.split("#")[0]).resolve()
              for line in _page(index).prose for _, target in _LINK.findall(_CODE_SPAN.sub("", line))
              if not re.match(r"[a-z][a-z0-9+.-]*:", target) and target.split("#")[0]}
    pages = {p.resolve() for p in _DOCS.rglob("*.md") if p != index}
    missing = sorted(str(p.relative_to(_REPO)) for p in pages - linked)
    assert missing == [], f"pages the index (docs/README.md) does not link: {missing}"


# ---------------------------------------------------------------------------
# The architecture page: modules and imports.


def _library_modules() -> set[str]:
    """The path of every module of the library packages, e.g. 'imaging/formats/jpeg.py'."""
    return {str(p.relative_to(_REPO)) for package in _PACKAGES for p in (_REPO / package).rglob("*.py")
            if "__pycache__" not in p.parts}


def _module_rows() -> list[str]:
    """The module of each row of the architecture page's module tables (first cell, in backticks)."""
    rows = []
    for line in _page(_ARCHITECTURE).prose:
        if line.startswith("|"):
            first = re.split(r"(?<!\\)\|", line)[1].strip()
            rows += [s for s in _code_spans(first) if s.endswith(".py") and s.split("/")[0] in _PACKAGES]
    return rows


def test_every_module_has_one_row_in_the_architecture_page():
    rows = _module_rows()
    modules = _library_modules()
    assert len(modules) > 50, modules  # The packages were found.
    duplicates = sorted(m for m, n in collections.Counter(rows).items() if n > 1)
    assert duplicates == [], f"modules with several rows in docs/architecture.md: {duplicates}"
    assert sorted(modules - set(rows)) == [], "modules without a row in docs/architecture.md"
    assert sorted(set(rows) - modules) == [], "rows of docs/architecture.md naming no module"


def test_every_repository_path_the_docs_name_exists():
    missing = []
    for path in _PAGES:
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            for name in _REPO_PATH.findall(line):
                if not (_REPO / name.rstrip("/")).exists():
                    missing.append(f"{path.relative_to(_REPO)}:{number}: {name}")
    assert missing == []


def _allowed_imports() -> dict[str, set[str]]:
    rows = _table_with(_ARCHITECTURE, "The layers", "package")
    allowed = {}
    for package_cell, imports_cell in rows:
        (package,) = _code_spans(package_cell)
        allowed[package] = set(_code_spans(imports_cell))
    return allowed


def _first_party_imports(path: pathlib.Path, package: str):
    """(imported package, line) of every import of another library package in `path`, functions included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [package] if node.level else [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in _PACKAGES and top != package:
                yield top, node.lineno


def test_every_import_between_packages_is_allowed_by_the_architecture_page():
    allowed = _allowed_imports()
    assert sorted(allowed) == sorted(_PACKAGES), "one row per package in the table of docs/architecture.md"
    for package, imports in allowed.items():
        assert imports <= set(_PACKAGES) - {package}, (package, imports)
    found, wrong = collections.defaultdict(set), []
    for module in sorted(_library_modules()):
        package = module.split("/")[0]
        for imported, line in _first_party_imports(_REPO / module, package):
            found[package].add(imported)
            if imported not in allowed[package]:
                wrong.append(f"{module}:{line} imports {imported}")
    assert found["shardsmith"] and found["beam_jobs"], found  # The imports were seen.
    assert wrong == [], "imports docs/architecture.md does not allow (fix the code, or the table)"


# ---------------------------------------------------------------------------
# Command lines.


@dataclasses.dataclass(frozen=True)
class CommandLine:
    where: str
    command: str  # A shardsmith subcommand ('convert', 'verify', ...).
    argv: tuple[str, ...]
    text: str


def _logical_lines(block: Block):
    """(line number, text) of each line of a shell block, continuation lines joined."""
    pending, start = "", None
    for offset, line in enumerate(block.text.splitlines(), 1):
        if start is None:
            start = block.line + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending, start = "", None


def _command(tokens: list[str]) -> tuple[str, list[str]] | None:
    """('convert', argv) of a shardsmith command line's tokens, or None for any other command."""
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
        tokens = tokens[1:]  # VAR=value before the command.
    if not tokens:
        return None
    program = os.path.basename(tokens[0])
    if program == "shardsmith":
        return (tokens[1], tokens[2:]) if len(tokens) > 1 else ("", [])
    if re.fullmatch(r"python[0-9.]*", program) and tokens[1:2] == ["-m"] and len(tokens) > 2:
        module = tokens[2]
        if module == "shardsmith":
            return (tokens[3], tokens[4:]) if len(tokens) > 3 else ("", [])
        if module in ("beam_jobs.convert", "beam_jobs.verify"):
            return module.split(".")[1], tokens[3:]
    return None


def _command_lines() -> list[CommandLine]:
    found = []
    for block in _all_blocks():
        if block.language not in _SHELL_LANGUAGES:
            continue
        for number, line in _logical_lines(block):
            text = line.strip()
            if text.startswith("$ "):
                text = text[2:]
            tokens = shlex.split(text, comments=True)
            parsed = _command(tokens)
            if parsed is not None:
                found.append(CommandLine(f"{block.page.relative_to(_REPO)}:{number}", parsed[0],
                                         tuple(parsed[1]), text))
    return found


_COMMAND_LINES = _command_lines()


def test_the_docs_show_command_lines_of_every_subcommand():
    commands = {c.command for c in _COMMAND_LINES}
    assert {"convert", "verify", "inspect", "preview", "serve-data", "doctor"} <= commands, commands


def test_shardsmith_command_lines_are_in_shell_blocks():
    outside = [f"{b.where}: {line.strip()}" for b in _all_blocks() if b.language not in _SHELL_LANGUAGES
               for line in b.text.splitlines() if re.match(r"\s*(\$ )?(\.venv/bin/)?shardsmith ", line)]
    assert outside == [], "write command lines in ```sh blocks, where they are checked"


class _Refused(Exception):
    """A command line the parsers refuse."""


@contextlib.contextmanager
def _argparse_errors():
    """argparse reports an error by printing it and exiting: turns that into `_Refused`."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            yield
    except SystemExit as e:
        raise _Refused(stderr.getvalue().strip() or f"exit {e.code}") from None


def _subcommand_parser(command: str) -> argparse.ArgumentParser:
    """The parser of `shardsmith inspect|preview|serve-data|doctor`, as the command builds it."""
    from shardsmith import cli

    parser = argparse.ArgumentParser(prog=f"shardsmith {command}", add_help=False)
    cli._ADD_ARGUMENTS[command](parser)  # The command's own table of its arguments.
    return parser


def _parse(command: str, argv: list[str]) -> None:
    """Parses a command line as `shardsmith COMMAND` does before it runs, without running it.

    Raises:
      _Refused: With the parsers' message.
    """
    from beam_jobs import args

    if command == "convert":
        from beam_jobs.convert import ConvertOptions, config_from_options

        try:
            with _argparse_errors():
                options = args.pipeline_options(argv, ConvertOptions)
                config_from_options(options)  # Every value checked; no file touched.
        except (ValueError, TypeError) as e:
            raise _Refused(str(e)) from None
    elif command == "verify":
        from beam_jobs.verify import VerifyOptions

        if argv and not argv[0].startswith("-"):
            argv = ["--dataset_dir", argv[0], *argv[1:]]  # As `beam_jobs.verify.run` passes it to Beam.
        try:
            with _argparse_errors():
                options = args.pipeline_options(argv, VerifyOptions)
                if not options.view_as(VerifyOptions).dataset_dir:
                    raise _Refused("no dataset folder")
        except ValueError as e:
            raise _Refused(str(e)) from None
    else:
        from shardsmith import cli

        if command not in cli._ADD_ARGUMENTS:
            raise _Refused(f"no subcommand {command!r}")
        parser = _subcommand_parser(command)
        try:
            args.check_arguments(parser, argv)
        except args.UsageError as e:
            raise _Refused(str(e)) from None
        with _argparse_errors():
            parser.parse_args(argv)


@pytest.mark.parametrize("line", _COMMAND_LINES, ids=[c.where for c in _COMMAND_LINES])
def test_command_lines_parse(line: CommandLine):
    try:
        _parse(line.command, list(line.argv))
    except _Refused as e:
        pytest.fail(f"{line.where}: `{line.text}` is refused: {e}")


@pytest.mark.parametrize("command, argv", [
    ("convert", ["--input_dir", "in", "--output_dir", "out", "--num_shard", "2"]),
    ("convert", ["--input_dir", "in", "--output_dir", "out", "--seed", "x"]),
    ("convert", ["--input_dir", "in", "--output_dir", "out", "--split", "train=lots"]),
    ("convert", ["--output_dir", "out"]),
    ("verify", ["--report", "r.json"]),
    ("preview", ["dataset", "--per_class", "many"]),
    ("doctor", ["dataset"]),
    ("serve-data", ["--wrokers", "2"]),
    ("server-data", []),
])
def test_the_command_line_check_refuses_what_the_commands_refuse(command, argv):
    with pytest.raises(_Refused):
        _parse(command, argv)


# ---------------------------------------------------------------------------
# Option tables.


def _flags(add_arguments) -> dict[str, argparse.Action]:
    """{flag: action} of the options `add_arguments` adds; positional and hidden ones left out."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return {action.option_strings[0]: action for action in parser._actions
            if action.option_strings and action.help != argparse.SUPPRESS}


def _command_flags() -> dict[tuple[str, str], tuple[str, dict[str, argparse.Action]]]:
    """{(page, heading): (command, its flags)} of every table of flags the docs keep."""
    from beam_jobs.convert import ConvertOptions
    from beam_jobs.verify import VerifyOptions
    from conversion import console
    from shardsmith import doctor, preview, serve_data

    def with_verbose(add):
        def both(parser):
            add(parser)
            parser.add_argument(console.VERBOSE_FLAG, action="store_true")
        return both

    return {
        ("preparing/converting.md", "Options"): ("convert", _flags(with_verbose(ConvertOptions._add_argparse_args))),
        ("preparing/checking.md", "verify"): ("verify", _flags(with_verbose(VerifyOptions._add_argparse_args))),
        ("preparing/checking.md", "preview"): ("preview", _flags(preview.add_arguments)),
        ("reading/service.md", "When one host's cores run out"): ("serve-data", _flags(serve_data.add_arguments)),
        ("reading/doctor.md", "Does training wait for its input? The doctor"): ("doctor", _flags(doctor.add_arguments)),
    }


def _documented_default(action: argparse.Action, literal: str):
    return action.type(literal) if callable(action.type) else literal


def test_every_flag_is_in_its_table_with_its_default():
    problems = []
    for (page, heading), (command, flags) in _command_flags().items():
        rows = _table_with(_DOCS / page, heading, "flag")
        documented = {}
        for row in rows:
            spans = _code_spans(row[0])
            assert spans, f"{page}: a row without a flag in backticks: {row}"
            documented[spans[0].split()[0]] = row
        for flag in sorted(set(flags) - set(documented)):
            problems.append(f"{page}: `{command}` flag {flag} is not in the table")
        for flag in sorted(set(documented) - set(flags)):
            problems.append(f"{page}: {flag} is no flag of `{command}`")
        for flag in sorted(set(flags) & set(documented)):
            action, cell = flags[flag], documented[flag][1]
            if action.default is None or action.default is False or action.default == "" or action.required:
                continue  # The table says in words what applies (none, off, required, ...).
            literals = _code_spans(cell)
            if not literals or _documented_default(action, literals[0]) != action.default:
                problems.append(f"{page}: {flag}'s default is `{action.default}`; the table says {cell!r}")
    assert problems == []


def test_every_reader_argument_is_in_its_table_with_its_default():
    import readers

    parameters = inspect.signature(readers.image_dataset_from_tfrecords).parameters
    rows = _table_with(_DOCS / "reading" / "reader.md", "Every argument", "argument")
    documented = {_code_spans(row[0])[0]: row[1] for row in rows}
    assert sorted(documented) == sorted(parameters), "the table of docs/reading/reader.md and the signature differ"
    wrong = []
    for name, parameter in parameters.items():
        if parameter.default is inspect.Parameter.empty:
            assert documented[name] == "", name
            continue
        literals = _code_spans(documented[name])
        if not literals or ast.literal_eval(literals[0]) != parameter.default:
            wrong.append(f"{name}: the default is {parameter.default!r}; the table says {documented[name]!r}")
    assert wrong == []


def test_every_reject_and_skip_reason_is_documented():
    import schemas

    text = (_DOCS / "preparing" / "output.md").read_text(encoding="utf-8")
    reasons = {*schemas.REJECT_REASONS, *schemas.SKIP_REASONS}
    missing = sorted(r for r in reasons if f"`{r}`" not in text)
    assert missing == [], "reasons docs/preparing/output.md does not explain"


# ---------------------------------------------------------------------------
# Links.


def test_relative_links_and_anchors_resolve():
    broken, checked = [], 0
    for path in _PAGES:
        for number, line in enumerate(_page(path).prose, 1):
            for _, target in _LINK.findall(_CODE_SPAN.sub("", line)):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # https:, mailto:: not ours to check offline.
                checked += 1
                file, _, anchor = target.partition("#")
                resolved = (path.parent / file).resolve() if file else path.resolve()
                where = f"{path.relative_to(_REPO)}:{number}: {target}"
                if _REPO not in resolved.parents and resolved != _REPO:
                    broken.append(f"{where} (outside the repository)")
                elif not resolved.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and (resolved.suffix != ".md" or anchor not in _anchors(resolved)):
                    broken.append(f"{where} (no such heading)")
    assert checked > 50, checked  # The links were found.
    assert broken == []


def test_github_anchors():
    # The anchors the link check expects, as GitHub renders them.
    assert _slug("The tf.data service: reading past one host") == "the-tfdata-service-reading-past-one-host"
    assert _slug("image_size=None: the stored size") == "image_sizenone-the-stored-size"
    assert _slug("Does training wait for its input? The doctor") == "does-training-wait-for-its-input-the-doctor"
    assert _slug("`--resume` and [links](x.md)") == "--resume-and-links"


# ---------------------------------------------------------------------------
# Runnable examples.


def _runnable_examples() -> list[Block]:
    return [b for b in _all_blocks() if b.before == _RUNNABLE]


_EXAMPLES = _runnable_examples()


def test_runnable_markers_are_spelled_right_and_mark_python():
    wrong = [f"{b.where}: {b.before}" for b in _all_blocks()
             if b.before.startswith("<!--") and (b.before != _RUNNABLE or b.language != "python")]
    assert wrong == [], f"only {_RUNNABLE}, just before a ```python fence"
    assert len(_EXAMPLES) >= 8, [b.where for b in _EXAMPLES]
    assert any(b.page == _README for b in _EXAMPLES), "the README's reading example runs"


# Runs in the child: each example in a fresh namespace, its output kept; the results are written
# after each example, so that a crash leaves those before it.
_RUN_EXAMPLES = r'''
import contextlib, io, json, os, sys, traceback
examples, out = json.load(open(sys.argv[1])), sys.argv[2]
results = {}
for example in examples:
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            exec(compile(example["code"], example["where"], "exec"), {"__name__": "__main__"})
        results[example["where"]] = {"ok": True, "output": stdout.getvalue()}
    except BaseException:
        results[example["where"]] = {"ok": False, "output": stdout.getvalue(),
                                     "error": traceback.format_exc()}
    with open(out, "w") as f:
        json.dump(results, f)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # Without the interpreter's teardown of TensorFlow (~2 s of CPU).
'''


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory) -> pathlib.Path:
    """A folder holding `dataset`: the demo's photos, converted as `make demo` converts them."""
    from bench import corpus
    from beam_jobs import convert

    root = tmp_path_factory.mktemp("docs_demo")
    images = root / "images"
    images.mkdir()
    corpus.make_demo(str(images))
    folder = root / "work"
    folder.mkdir()
    convert.run(["--input_dir", str(images), "--output_dir", str(folder / "dataset"), "--split", _DEMO_SPLIT])
    return folder


@pytest.fixture(scope="module")
def example_results(demo_folder, tmp_path_factory) -> dict:
    """{where: result} of every runnable example, run one after the other in one child process."""
    tmp = tmp_path_factory.mktemp("docs_examples")
    examples = tmp / "examples.json"
    results = tmp / "results.json"
    examples.write_text(json.dumps([{"where": b.where, "code": b.text} for b in _EXAMPLES]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(_REPO), os.environ.get("PYTHONPATH"))))}
    run = subprocess.run([sys.executable, "-c", _RUN_EXAMPLES, str(examples), str(results)], cwd=demo_folder,
                         env=env, capture_output=True, text=True, timeout=_EXAMPLES_TIMEOUT)
    found = json.loads(results.read_text()) if results.exists() else {}
    if len(found) < len(_EXAMPLES):
        missing = [b.where for b in _EXAMPLES if b.where not in found]
        found.update({w: {"ok": False, "error": f"the child ended (exit {run.returncode}) before it ran this "
                                               f"example:\n{run.stderr[-3000:]}"} for w in missing})
    return found


def test_the_demo_dataset_is_the_demo(demo_folder):
    import schemas

    manifest = json.loads((demo_folder / "dataset" / schemas.MANIFEST_FILENAME).read_text())
    assert manifest["counts"] == {"found": 54, "written": 51, "rejected": 2, "skipped": 1}
    assert sorted(manifest["splits"]) == ["train", "validation"]


@pytest.mark.parametrize("example", _EXAMPLES, ids=[b.where for b in _EXAMPLES])
def test_runnable_example_runs(example: Block, example_results):
    result = example_results[example.where]
    assert result["ok"], f"{example.where} failed:\n{result.get('error')}\noutput:\n{result.get('output')}"

"""Tests of compat/: private internals of TensorFlow, Beam and pydicom in quarantine."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

from compat import UntestedVersion, beam_internals, tf_internals
from compat._versions import check_version, installed_version

_REPO = pathlib.Path(__file__).resolve().parent.parent
# Where shardsmith's code lives (tests and benchmarks may poke at anything).
_CODE = ("schemas", "imaging", "beam_jobs", "readers", "shardsmith", "devtools")
_LIBRARIES = ("tensorflow", "apache_beam", "pydicom")
# Modules of those libraries that are internals as a whole.
_PRIVATE_MODULES = re.compile(
    r"^(tensorflow\.(python|core)|apache_beam\.(internal|runners\.common"
    r"|runners\.dask\.overrides)|pydicom\._)"
)


def _fresh_python(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=_REPO).stdout
    return out.split("\n")


def test_the_installed_libraries_are_the_tested_ones():
    # The versions setup.py allows are those checked at use; this machine has them.
    tf_internals.check("test")
    beam_internals.check("test")


def test_an_untested_version_is_a_clear_error():
    with pytest.raises(UntestedVersion) as e:
        check_version("apache_beam", "2.80.1", beam_internals.TESTED, "--runner DaskRunner")
    message = str(e.value)
    assert "--runner DaskRunner" in message and "apache_beam>=2.77,<2.78" in message
    assert "installed: 2.80.1" in message
    with pytest.raises(UntestedVersion, match="unknown version"):
        check_version("tensorflow", None, tf_internals.TESTED, "x")
    check_version("tensorflow", "2.21.0rc1", tf_internals.TESTED, "x")  # In range: no error.
    assert installed_version("no-such-distribution-here") is None


def test_an_untested_tensorflow_takes_the_public_way():
    # Outside the tested range the decode ops come from the whole library,
    # and the Example messages from their public names: the same results.
    lines = _fresh_python(
        "import io\n"
        "from PIL import Image\n"
        "from compat import tf_internals\n"
        "tf_internals.TESTED = ('1.0', '1.1')\n"
        "from schemas import tf_runtime\n"
        "ops = tf_runtime.image_ops()\n"
        "buf = io.BytesIO()\n"
        "Image.new('RGB', (3, 2)).save(buf, 'JPEG')\n"
        "print(tuple(ops.decode_jpeg(buf.getvalue()).shape), tf_runtime.api_loaded())\n"
        "print(tf_runtime.example_pb2().Example.__name__)\n"
    )
    assert lines[:2] == ["(2, 3, 3) True", "Example"]


def test_decoding_freezes_nothing_and_leaks_nothing():
    # gc.freeze() froze whatever the caller had alive at that moment, for
    # good: its cyclic garbage was never collected again. Loading TensorFlow
    # now pauses the collector and freezes nothing (issue 23).
    lines = _fresh_python(
        "import gc, io\n"
        "from PIL import Image\n"
        "from schemas import IMAGE_SCHEMA, ImageRecord, tf_runtime\n"
        "buf = io.BytesIO()\n"
        "Image.new('RGB', (8, 8)).save(buf, 'JPEG')\n"
        "jpeg = buf.getvalue()\n"
        "record = IMAGE_SCHEMA.encode(ImageRecord(image=jpeg, label=1, filename='a.jpg',"
        " format='jpeg', height=8, width=8, channels=3))\n"
        "ops = tf_runtime.image_ops()\n"
        "for _ in range(10):\n"  # Warm-up: every lazy import done (the whole API too).
        "    IMAGE_SCHEMA.decode(record); tf_runtime.image_ops().decode_jpeg(jpeg); tf_runtime.full()\n"
        "gc.collect()\n"
        "frozen, objects = gc.get_freeze_count(), len(gc.get_objects())\n"
        "for _ in range(1000):\n"
        # A caller's object in a reference cycle, alive during the decode and
        # garbage after: frozen meanwhile, the collector would never free it.
        "    cycle = [record]; cycle.append(cycle)\n"
        "    IMAGE_SCHEMA.decode(record); tf_runtime.image_ops().decode_jpeg(jpeg); tf_runtime.full()\n"
        "    del cycle\n"
        "gc.collect()\n"
        "print(frozen, gc.get_freeze_count(), len(gc.get_objects()) - objects < 200, gc.isenabled())\n"
    )
    assert lines[0] == "0 0 True True"


def _private_uses(path: pathlib.Path) -> list[str]:
    """`file:line what` for each import of, or underscore attribute on, the libraries' internals."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    aliases = {}  # local name -> library module it names
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in _LIBRARIES:
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or alias.name.split(".")[0]
                    if _PRIVATE_MODULES.match(alias.name):
                        found.append(f"{node.lineno} import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in _LIBRARIES:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    aliases[alias.asname or alias.name] = full
                    if _PRIVATE_MODULES.match(full) or alias.name.startswith("_"):
                        found.append(f"{node.lineno} from {node.module} import {alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _PRIVATE_MODULES.match(node.value):  # importlib.import_module("tensorflow.python...")
                found.append(f"{node.lineno} {node.value!r}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                found.append(f"{node.lineno} {ast.unparse(node)}")
    return [f"{path.relative_to(_REPO)}:{use}" for use in found]


def test_only_compat_touches_private_internals():
    uses = [use for package in _CODE for path in sorted((_REPO / package).rglob("*.py"))
            for use in _private_uses(path)]
    assert uses == [], "private TensorFlow/Beam/pydicom internals outside compat/:\n" + "\n".join(uses)


def test_the_private_use_finder_finds_them():
    # The finder of the test above, on compat/ itself: it does find what is there.
    found = "\n".join(_private_uses(_REPO / "compat" / "beam_internals.py")
                      + _private_uses(_REPO / "compat" / "tf_internals.py"))
    for expected in ("DaskOptions._extract_bag_kwargs", "common._OutputHandler", "ov._Create",
                     "import tf2", "gen_image_ops", "apache_beam.internal import pickler"):
        assert expected in found, expected


def test_batch_decoders_leave_nothing_on_stderr_at_exit(tmp_path):
    # Their runtime callables would release themselves after TensorFlow's C
    # bindings are torn down ("Exception ignored ... TF_SessionReleaseCallable")
    # unless their sessions are closed at exit: a real conversion of JPEGs
    # (validated by the batch decoders), in its own interpreter, to its end.
    from PIL import Image

    for c in "ab":
        (tmp_path / "in" / c).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (20, 10), (40 * i, 0, 0)).save(tmp_path / "in" / c / f"{i}.jpg")
    out = subprocess.run(
        [sys.executable, "-m", "shardsmith", "convert", "--input_dir", str(tmp_path / "in"),
         "--output_dir", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=_REPO, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out" / "manifest.json").exists()
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr


_CLIENTS = ("pymongo", "bson", "pyarrow", "google.cloud.storage", "apache_beam.io.gcp.gcsio")


def test_beam_imports_without_remote_clients_and_runs_a_local_pipeline(tmp_path):
    # A fresh interpreter: Beam imported without the remote clients, then a
    # real DirectRunner pipeline writing a local file, then the clients
    # imported on demand (refused only during Beam's import).
    out = subprocess.run([sys.executable, "-c", f"""
import sys
from compat import beam_internals
print(beam_internals.import_without_remote_clients())
print(sorted(m for m in {_CLIENTS!r} if m in sys.modules))
import apache_beam as beam
with beam.Pipeline() as p:
    _ = p | beam.Create([3, 1, 2]) | beam.Map(str) | beam.io.WriteToText({str(tmp_path / 'o')!r})
print(beam_internals.import_without_remote_clients())
import pyarrow, pymongo
from apache_beam.io.gcp import gcsio
print("later imports work")
"""], capture_output=True, text=True, cwd=_REPO, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["True", "[]", "False", "later imports work"], out.stdout
    written = sorted(tmp_path.glob("o*"))
    assert written and sorted(written[0].read_text().split()) == ["1", "2", "3"]
    # Beam says nothing about the clients it went without.
    assert "bson" not in out.stderr and "GCSFileSystem" not in out.stderr, out.stderr


@pytest.mark.parametrize("argv, local", [
    (["--input_dir", "in", "--output_dir", "out", "--runner", "DirectRunner"], True),
    (["--input_dir", "in", "--output_dir", "out", "--temp_location=gs://b/t"], False),
    (["--input_dir", "in", "--output_dir", "out", "--runner", "DataflowRunner"], False),
    (["--input_dir", "in", "--output_dir", "out", "--runner=DaskRunner"], False),
])
def test_only_a_local_run_imports_beam_without_its_clients(argv, local):
    # A URL anywhere (input, output, temp or staging location) or another runner: Beam whole.
    lines = _fresh_python(f"""
import sys
from beam_jobs import _startup
_startup.import_beam({argv!r})
print("apache_beam" in sys.modules, "pymongo" in sys.modules)
""")
    assert lines[0] == f"True {not local}"


def _graph_functions(ds):
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    return [f.signature.name for f in graph.library.function]


def _ranges(tf, n):
    # (base, count) per "file": three files read over two ranges of counts.
    return tf.data.Dataset.from_tensor_slices((tf.constant([0, 100, 200], tf.int64),
                                               tf.constant([n, n + 1, n + 2], tf.int64)))


def test_interleave_each_traces_its_function_once(monkeypatch):
    import tensorflow as tf

    traces = []

    def read(base, count):
        traces.append(1)
        return tf.data.Dataset.range(base, base + count)

    inputs = [_ranges(tf, 2), _ranges(tf, 4)]
    expected = [list(d.interleave(read, cycle_length=2, block_length=1).as_numpy_iterator())
                for d in inputs]
    traces.clear()
    shared = tf_internals.interleave_each(inputs, read, cycle_length=2, block_length=1)
    assert traces == [1]  # one trace for both
    assert [list(d.as_numpy_iterator()) for d in shared] == expected
    both = shared[0].concatenate(shared[1])
    assert list(both.as_numpy_iterator()) == expected[0] + expected[1]
    assert len(_graph_functions(both)) == 1  # one function in the library, named by both ops
    # Outside the tested releases: the public interleave, one trace each, the same records.
    monkeypatch.setattr(tf_internals, "TESTED", ("1.0", "1.1"))
    traces.clear()
    public = tf_internals.interleave_each(inputs, read, cycle_length=2, block_length=1)
    assert traces == [1, 1]
    assert [list(d.as_numpy_iterator()) for d in public] == expected


def _graph_ops(ds) -> list[str]:
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    return [n.op for n in graph.node]


def test_interleave_each_reads_the_first_input_in_parallel_in_the_same_order(monkeypatch):
    import tensorflow as tf

    traces = []

    def read(base, count):
        traces.append(1)
        return tf.data.Dataset.range(base, base + count)

    inputs = [_ranges(tf, 5), _ranges(tf, 3)]
    expected = [list(d.interleave(read, cycle_length=2, block_length=1).as_numpy_iterator())
                for d in inputs]
    traces.clear()
    shared = tf_internals.interleave_each(inputs, read, cycle_length=2, block_length=1, parallel_first=2)
    assert traces == [1]
    both = shared[0].concatenate(shared[1])
    # Deterministic: the sequential interleave's order, even where the options allow another.
    options = tf.data.Options()
    options.deterministic = False
    assert list(both.with_options(options).as_numpy_iterator()) == expected[0] + expected[1]
    ops = _graph_ops(both)
    assert ops.count("ParallelInterleaveDatasetV4") == 1 and ops.count("InterleaveDataset") == 1, ops
    assert len(_graph_functions(both)) == 1
    monkeypatch.setattr(tf_internals, "TESTED", ("1.0", "1.1"))
    public = tf_internals.interleave_each(inputs, read, cycle_length=2, block_length=1, parallel_first=2)
    assert [list(d.as_numpy_iterator()) for d in public] == expected
    assert "ParallelInterleaveDatasetV4" in _graph_ops(public[0])


def test_unbatch_dense_has_no_identity_map(monkeypatch):
    import tensorflow as tf

    batches = tf.data.Dataset.range(10).batch(4).map(lambda x: {"a": x, "b": tf.strings.as_string(x)})
    expected = list(batches.unbatch().as_numpy_iterator())
    assert len(_graph_functions(batches.unbatch())) == 2  # the map's, and unbatch's `normalize`
    ours = tf_internals.unbatch_dense(batches)
    assert list(ours.as_numpy_iterator()) == expected
    assert ours.element_spec == batches.unbatch().element_spec
    assert len(_graph_functions(ours)) == 1
    # Ragged components need the re-encoding: the public unbatch.
    ragged = tf.data.Dataset.from_tensors(tf.ragged.constant([[1], [2, 3]]))
    assert [r.tolist() for r in tf_internals.unbatch_dense(ragged).as_numpy_iterator()] == [[1], [2, 3]]
    monkeypatch.setattr(tf_internals, "TESTED", ("1.0", "1.1"))
    assert list(tf_internals.unbatch_dense(batches).as_numpy_iterator()) == expected


def test_the_local_runner_loses_no_element_of_a_step_that_emits_for_seconds(tmp_path):
    # Beam's in-process workers flushed each output stream on a timer, racing the
    # writes: a step emitting for seconds (the rejects of 150,000 missing files)
    # lost elements, or cut one in two and failed to decode it.
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_jobs._runner import make_runner

    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    n = 600_000
    counted = tmp_path / "counted"
    options = PipelineOptions([])
    beams_own = worker_handlers.DATA_BUFFER_TIME_LIMIT_MS
    with beam.Pipeline(runner=make_runner(options), options=options) as p:
        rows = (p | "One" >> beam.Create([None])
                | "Emit" >> beam.FlatMap(lambda _: ((f"img{i:09d}.jpg", "missing_file", "m" * 60) for i in range(n))))
        _ = (p | "Once" >> beam.Create([None])
             | "Count" >> beam.Map(lambda _, found: counted.write_text(str(len(found))), beam.pvalue.AsList(rows)))
    assert counted.read_text() == str(n)
    # Only while our pipeline ran: a caller's later pipelines get Beam's own flushes back.
    assert worker_handlers.DATA_BUFFER_TIME_LIMIT_MS == beams_own > 0


def test_untimed_local_flushes_puts_beams_limit_back_after_a_failure():
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    beams_own = worker_handlers.DATA_BUFFER_TIME_LIMIT_MS
    with pytest.raises(KeyError):
        with beam_internals.untimed_local_flushes() as switched:
            assert switched is True
            assert worker_handlers.DATA_BUFFER_TIME_LIMIT_MS < 0
            raise KeyError("a step failed")
    assert worker_handlers.DATA_BUFFER_TIME_LIMIT_MS == beams_own

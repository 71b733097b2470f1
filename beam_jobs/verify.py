"""Verifies a converted dataset against its manifest, record by record.

  python -m beam_jobs.verify ./dataset
  python -m beam_jobs.verify gs://BUCKET/dataset --runner DataflowRunner ... --setup_file ./setup.py

Every shard is read in full: its size and sha256, the CRC of every record, the
parse of every record against the schema, and a decode of every image with the
reader's TensorFlow op. Counts per split, shard and class are compared with
`manifest.json`, index files are checked, and images with the same content are
reported, within a split and across splits (a duplicate across train and test
inflates every metric). The findings go to `verify_report.json` in the dataset
folder; the exit code is non-zero on any mismatch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

import schemas
from beam_jobs import _runner
from beam_jobs._tfrecord import RecordError, iter_records, read_bytes, write_atomically

__all__ = ["VerifyOptions", "VerifyDataset", "run", "main"]

_LOG = logging.getLogger("shardsmith.verify")
_NAMESPACE = "shardsmith"


class VerifyOptions(PipelineOptions):
    """Command-line options of verify (Beam's own options come on top)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--dataset_dir", help="Folder written by the converter.")
        parser.add_argument(
            "--report",
            help=f"Where to write the JSON report (default: DATASET_DIR/{schemas.VERIFY_REPORT_FILENAME}).",
        )
        parser.add_argument(
            "--fail_on_duplicates", action="store_true",
            help="Exit non-zero when the same image content appears in two splits.",
        )


@dataclasses.dataclass(frozen=True)
class _ShardCheck:
    split: str
    file: str
    num_records: int
    class_counts: tuple[int, ...]
    problems: tuple[str, ...]


class _VerifyShardFn(beam.DoFn):
    """Reads one shard and checks everything about it.

    Input: (split, ShardInfo). Main output: _ShardCheck. Tagged output
    CONTENT: (sha256 of image bytes, (split, filename)).
    """

    CONTENT = "content"

    def __init__(self, dataset_dir: str, features, num_classes: int):
        self._dir = dataset_dir
        self._features = dict(features)
        self._num_classes = num_classes
        self._records = Metrics.counter(_NAMESPACE, "records_verified")
        self._schema = None
        self._tf = None

    def setup(self):
        import tensorflow as tf

        self._tf = tf
        self._schema = schemas.ImageExampleSchema.from_json(self._features)

    def process(self, element):
        split, shard = element
        problems = []
        counts = [0] * self._num_classes
        path = FileSystems.join(self._dir, shard.file)
        sha = hashlib.sha256()
        size = 0
        offsets = []
        if not FileSystems.exists(path):
            yield _ShardCheck(split, shard.file, 0, tuple(counts), (f"{shard.file}: file is missing",))
            return
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            reader = _HashingReader(f, sha)
            try:
                for number, (offset, length, data) in enumerate(iter_records(reader)):
                    offsets.append((offset, length))
                    problem, label, digest, name = self._check_record(data)
                    if problem:
                        problems.append(f"{shard.file}: record {number} (byte {offset}): {problem}")
                        continue
                    counts[label] += 1
                    self._records.inc()
                    yield beam.pvalue.TaggedOutput(self.CONTENT, (digest, (split, name)))
            except RecordError as e:
                problems.append(f"{shard.file}: {e}; the rest of the shard is unreadable")
            size = reader.size
        if size != shard.num_bytes:
            problems.append(f"{shard.file}: {size} bytes, the manifest says {shard.num_bytes}")
        elif sha.hexdigest() != shard.sha256:
            problems.append(f"{shard.file}: sha256 differs from the manifest")
        if len(offsets) != shard.num_records:
            problems.append(f"{shard.file}: {len(offsets)} records, the manifest says {shard.num_records}")
        if tuple(counts) != tuple(shard.class_counts):
            problems.append(f"{shard.file}: class counts {counts}, the manifest says {list(shard.class_counts)}")
        problems.extend(self._check_index(shard, offsets))
        yield _ShardCheck(split, shard.file, len(offsets), tuple(counts), tuple(problems))

    def _check_record(self, data: bytes):
        """Returns (problem or None, label, content digest, filename)."""
        try:
            values = self._schema.decode(data)
        except ValueError as e:
            return f"does not parse: {e}", None, None, None
        name = values[schemas.FILENAME.key].decode("utf-8", "backslashreplace")
        label = values[schemas.LABEL.key]
        if not 0 <= label < self._num_classes:
            return f"{name}: label {label} is outside [0, {self._num_classes})", None, None, name
        image = values[schemas.IMAGE.key]
        try:
            shape = self._tf.io.decode_image(image, expand_animations=False).shape
        except self._tf.errors.OpError as e:
            return f"{name}: image does not decode ({e.message.split('}}')[-1].strip()})", None, None, name
        stored = (values[schemas.HEIGHT.key], values[schemas.WIDTH.key], values[schemas.CHANNELS.key])
        if tuple(shape) != stored:
            return f"{name}: decodes to {tuple(shape)}, the record says {stored}", None, None, name
        return None, label, hashlib.sha256(image).hexdigest(), name

    def _check_index(self, shard, offsets):
        if not shard.index_file:
            return []
        path = FileSystems.join(self._dir, shard.index_file)
        if not FileSystems.exists(path):
            return [f"{shard.index_file}: index file is missing"]
        data = read_bytes(path)
        if hashlib.sha256(data).hexdigest() != shard.index_sha256:
            return [f"{shard.index_file}: sha256 differs from the manifest"]
        want = "".join(f"{o} {n}\n" for o, n in offsets).encode()
        return [] if data == want else [f"{shard.index_file}: offsets do not match the shard's records"]


class _HashingReader:
    """A file wrapper that hashes and counts what is read through it."""

    def __init__(self, f, sha):
        self._f = f
        self._sha = sha
        self.size = 0

    def read(self, n: int) -> bytes:
        data = self._f.read(n)
        self._sha.update(data)
        self.size += len(data)
        return data


def _duplicate_group(element):
    digest, members = element
    members = sorted(members)
    if len(members) > 1:
        yield {"sha256": digest, "images": [{"split": s, "filename": n} for s, n in members],
               "splits": sorted({s for s, _ in members})}


class _ReportFn(beam.DoFn):
    """Builds the report from every shard check and duplicate group; writes it."""

    def __init__(self, manifest_json: str, report_path: str):
        self._manifest_json = manifest_json
        self._report_path = report_path

    def process(self, unused, checks, duplicates):
        manifest = schemas.Manifest.from_json(self._manifest_json)
        problems = [p for c in sorted(checks, key=lambda c: c.file) for p in c.problems]
        splits = {}
        for name, info in manifest.splits.items():
            mine = [c for c in checks if c.split == name]
            records = sum(c.num_records for c in mine)
            counts = tuple(sum(col) for col in zip(*(c.class_counts for c in mine))) if mine else ()
            if records != info.num_records:
                problems.append(f"split {name}: {records} records, the manifest says {info.num_records}")
            if mine and counts != info.class_counts:
                problems.append(f"split {name}: class counts {list(counts)}, the manifest says "
                                f"{list(info.class_counts)}")
            splits[name] = {"shards": len(mine), "records": records}
        duplicates = sorted(duplicates, key=lambda d: d["images"][0]["filename"])
        report = {
            "ok": not problems,
            "problems": problems,
            "splits": splits,
            "records": sum(s["records"] for s in splits.values()),
            "duplicates": {
                "groups": len(duplicates),
                "across_splits": sum(1 for d in duplicates if len(d["splits"]) > 1),
                "list": duplicates,
            },
        }
        text = json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        directory, name = self._report_path.rsplit("/", 1) if "/" in self._report_path else (".", self._report_path)
        write_atomically(directory, name, text.encode())
        yield report


class VerifyDataset(beam.PTransform):
    """The verify pipeline body: shards in, one report dict out.

    Args:
      dataset_dir: The dataset folder.
      manifest: Its parsed `Manifest`.
      manifest_json: The manifest's text (passed to workers as plain data).
      report_path: Where the report is written.
    """

    def __init__(self, dataset_dir: str, manifest: schemas.Manifest, manifest_json: str, report_path: str):
        super().__init__()
        self._dir = dataset_dir
        self._manifest = manifest
        self._manifest_json = manifest_json
        self._report_path = report_path

    def expand(self, pbegin):
        m = self._manifest
        shards = [(split, shard) for split, info in m.splits.items() for shard in info.shards]
        checked = (
            pbegin
            | "Shards" >> beam.Create(shards)  # (split, ShardInfo)
            | "VerifyShards" >> beam.ParDo(
                _VerifyShardFn(self._dir, m.features, len(m.class_names))
            ).with_outputs(_VerifyShardFn.CONTENT, main="checks")
        )
        duplicates = (
            checked[_VerifyShardFn.CONTENT]  # (sha256, (split, filename))
            | "GroupByContent" >> beam.GroupByKey()
            | "DuplicateGroups" >> beam.FlatMap(_duplicate_group)
        )
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "Report" >> beam.ParDo(
                _ReportFn(self._manifest_json, self._report_path),
                checks=beam.pvalue.AsList(checked.checks),
                duplicates=beam.pvalue.AsList(duplicates),
            )
        )


def _load_manifest(dataset_dir: str) -> tuple[schemas.Manifest, str]:
    path = FileSystems.join(dataset_dir, schemas.MANIFEST_FILENAME)
    if not FileSystems.exists(path):
        raise schemas.ManifestError(
            f"{dataset_dir} has no {schemas.MANIFEST_FILENAME}: it is not a finished shardsmith "
            "dataset (the conversion did not complete, or this is the wrong folder). "
            "Run the conversion again with --overwrite."
        )
    text = read_bytes(path).decode()
    return schemas.Manifest.from_json(text, path), text


def run(argv: list[str] | None = None) -> dict:
    """Verifies a dataset; returns the report (also written as JSON).

    Raises:
      ManifestError: If the folder has no readable manifest.
      ValueError: If --dataset_dir is missing.
    """
    argv = list(argv or [])
    if argv and not argv[0].startswith("-"):
        argv = ["--dataset_dir", argv[0], *argv[1:]]
    options = PipelineOptions(argv)
    opts = options.view_as(VerifyOptions)
    if not opts.dataset_dir:
        raise ValueError("Give the dataset folder: python -m beam_jobs.verify DATASET_DIR")
    dataset_dir = opts.dataset_dir.rstrip("/")
    manifest, text = _load_manifest(dataset_dir)
    report_path = opts.report or FileSystems.join(dataset_dir, schemas.VERIFY_REPORT_FILENAME)
    pipeline = beam.Pipeline(runner=_runner.make_runner(options), options=options)
    _ = pipeline | "VerifyDataset" >> VerifyDataset(dataset_dir, manifest, text, report_path)
    pipeline.run().wait_until_finish()
    report = json.loads(read_bytes(report_path).decode())
    report["report_path"] = report_path
    return report


def describe(report: dict) -> str:
    """The report as a few lines for people."""
    dup = report["duplicates"]
    lines = [
        ("OK" if report["ok"] else "MISMATCH") + f": {report['records']:,} records in "
        + ", ".join(f"{s} ({v['shards']} shards, {v['records']:,} records)" for s, v in report["splits"].items())
        + " read, CRC-checked, parsed and decoded."
    ]
    lines += [f"  - {p}" for p in report["problems"][:50]]
    if len(report["problems"]) > 50:
        lines.append(f"  ... and {len(report['problems']) - 50} more: see {report['report_path']}")
    if dup["groups"]:
        lines.append(
            f"Duplicates: {dup['groups']} group{'s' if dup['groups'] > 1 else ''} of identical images, "
            f"{dup['across_splits']} of them "
            f"across splits (a leak between train and evaluation): see {report['report_path']}"
        )
    else:
        lines.append("No duplicate images.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 when the dataset matches its manifest, 1 when not, 2 on bad use."""
    _runner.configure_logging()
    argv = sys.argv[1:] if argv is None else argv
    try:
        report = run(argv)
    except (ValueError, FileNotFoundError) as e:  # ManifestError is a ValueError.
        print(f"shardsmith verify: error: {e}", file=sys.stderr)
        return 2
    _LOG.info("%s", describe(report))
    fail_dups = PipelineOptions(argv).view_as(VerifyOptions).fail_on_duplicates
    if not report["ok"] or (fail_dups and report["duplicates"]["across_splits"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

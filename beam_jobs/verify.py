"""Verifies a converted dataset against its manifest, record by record.

  python -m beam_jobs.verify ./dataset
  python -m beam_jobs.verify gs://BUCKET/dataset --runner DataflowRunner ... --setup_file ./setup.py

Every shard is read in full: its size and sha256, the CRC of every record, the
parse of every record against the schema, and a decode of every image with the
reader's TensorFlow op. Targets are checked against the record contract and
the manifest's `targets` section: masks decode to the image's size at the
stated depth, boxes lie in [0, 1] with labels in range, multi-labels are
sorted and in range, regression targets have their length (per-class pixel
counts are not recomputed). Patches of scenes (--raster_patch) have the
manifest's patch size, offsets on their scene's grid (the size normalized.jsonl
records, the stride and edge formula) and, per scene, written + skipped equal
to the grid's count. Counts per split, shard and class are compared with
`manifest.json`, index files are checked, and images with the same content are
reported, within a split and across splits (a duplicate across train and test
inflates every metric). The findings go to `verify_report.json` in the dataset
folder; the exit code is non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

if __name__ == "__main__":
    # Run as a program (`python -m beam_jobs.verify`): Beam logs a notice about
    # BigQuery clients on the root logger as it is imported, below, before
    # `main` runs; the console's logging must be in place first. Imported as
    # a module (`shardsmith verify`, tests), this does nothing.
    from conversion import console as _console

    _console.configure_logging(_console.is_verbose(sys.argv[1:]))

import apache_beam as beam  # noqa: E402 (after the logging of a program run)
from apache_beam.options.pipeline_options import PipelineOptions

import schemas
from beam_jobs import _runner, _verify_fns, args
from beam_jobs._verify_fns import CHECK_FAILED
from conversion import console, scene_log
from conversion.files import exists, join, output_full_text, read_bytes
from imaging import nodata as _nodata
from imaging.patches import PatchOptions

__all__ = ["VerifyOptions", "VerifyDataset", "run", "main", "help_text", "EXIT_CHECKS_FAILED"]

_LOG = logging.getLogger("shardsmith.verify")

_EXAMPLE = """\
    example:
      shardsmith verify ./dataset
      shardsmith verify gs://bucket/dataset --runner DataflowRunner ... --setup_file ./setup.py"""


class VerifyOptions(PipelineOptions):
    """Command-line options of verify (Beam's own options come on top)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        # The positional DATASET_DIR reaches Beam as this flag (see `run`); the
        # help shows the positional only.
        parser.add_argument("--dataset_dir", help=argparse.SUPPRESS)
        _add_flags(parser)


def _add_flags(parser) -> None:
    """The options of verify other than the dataset folder."""
    parser.add_argument(
        "--report",
        help=f"Where to write the JSON report (default: DATASET_DIR/{schemas.VERIFY_REPORT_FILENAME}).",
    )
    parser.add_argument(
        "--fail_on_duplicates", action="store_true",
        help="Exit non-zero when the same image content appears in two splits.",
    )


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
        patches = _patch_options(m)
        rasters_needed = any(shard.band_stats is not None for _, shard in shards)
        normalized = self._normalized() if rasters_needed or patches is not None else None
        # The raster records the band statistics cover; None when normalized.jsonl is missing.
        rasters = {} if not rasters_needed else (
            None if normalized is None else _verify_fns.raster_records(normalized))
        if schemas.TIME_SERIES in m.extra:
            # Stacks: each location's nodata value, from the manifest (`conversion.time_series`).
            rasters = {loc: _nodata.from_json(v.get("nodata"))  # Per band: a list.
                       for loc, v in m.extra[schemas.TIME_SERIES]["locations"].items()}
            if normalized is not None:
                # A stack record whose files' masks left samples out: its statistics as recorded.
                rasters.update((name, known) for name, known in _verify_fns.raster_records(normalized).items()
                               if isinstance(known, schemas.BandStats))
        fn = _verify_fns.VerifyShardFn
        checked = (
            pbegin
            | "Shards" >> beam.Create(shards)  # (split, ShardInfo)
            | "VerifyShards" >> beam.ParDo(
                fn(self._dir, m.features, len(m.class_names), resize=m.options.get("resize"), rasters=rasters,
                   targets=dict(m.targets), patch_size=None if patches is None else patches.size)
            ).with_outputs(fn.CONTENT, fn.PATCHES, main="checks")
        )
        duplicates = (
            checked[fn.CONTENT]  # (sha256, (split, filename))
            | "GroupByContent" >> beam.GroupByKey()
            | "DuplicateGroups" >> beam.FlatMap(_verify_fns.duplicate_group)
        )
        side = {}
        if patches is not None:
            side["scene_problems"] = beam.pvalue.AsList(
                self._scene_problems(pbegin, checked[fn.PATCHES], normalized, patches))
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "Report" >> beam.ParDo(
                _verify_fns.ReportFn(self._manifest_json, self._report_path),
                checks=beam.pvalue.AsList(checked.checks),
                duplicates=beam.pvalue.AsList(duplicates),
                **side,
            )
        )

    def _normalized(self) -> str | None:
        """normalized.jsonl's text; None if it is missing."""
        path = join(self._dir, schemas.NORMALIZED_FILENAME)
        if not exists(path):
            return None
        return read_bytes(path).decode("utf-8")

    @staticmethod
    def _scene_problems(pbegin, found, normalized: str | None, options):
        """Each scene's records (`found`: (scene, (y, x))) against its grid and normalized.jsonl entries."""
        if normalized is None:
            return pbegin | "NoSceneLog" >> beam.Create(
                [f"patch offsets cannot be checked: {schemas.NORMALIZED_FILENAME}, which records each "
                 "scene's size and work items, is missing"])
        logs = scene_log.scene_logs_from_jsonl(normalized)
        return (
            {"log": pbegin | "SceneLogs" >> beam.Create(sorted(logs.items())), "patches": found}
            | "GroupByScene" >> beam.CoGroupByKey()
            | "CheckScenes" >> beam.FlatMap(_verify_fns.check_scene, options)
        )


def _patch_options(manifest: schemas.Manifest) -> PatchOptions | None:
    """The manifest's --raster_patch options (options.raster.patch); None for a dataset not cut into patches.

    Raises:
      ManifestError: For a patch section that does not give a valid size, stride and edge.
    """
    patch = (manifest.options.get("raster") or {}).get("patch")
    if patch is None:
        return None
    try:
        return PatchOptions(tuple(patch["size"]), tuple(patch["stride"]), patch["edge"],
                            patch.get("max_nodata", 1.0))
    except (KeyError, TypeError, ValueError) as e:
        raise schemas.ManifestError(f"the manifest's options.raster.patch is not valid ({e}): {patch!r}") from e


def _local_folder_problem(dataset_dir: str) -> str | None:
    """`schemas.not_a_dataset_folder` of a path; whether it exists is told for local paths only."""
    local = not schemas.is_url(dataset_dir)
    return schemas.not_a_dataset_folder(dataset_dir, exists=os.path.exists(dataset_dir) if local else None,
                                        is_file=local and os.path.isfile(dataset_dir))


def _load_manifest(dataset_dir: str) -> tuple[schemas.Manifest, str]:
    problem = _local_folder_problem(dataset_dir)
    if problem:
        raise schemas.ManifestError(problem)
    path = join(dataset_dir, schemas.MANIFEST_FILENAME)
    if not exists(path):
        raise schemas.ManifestError(
            f"{dataset_dir} has no {schemas.MANIFEST_FILENAME}: it is not a finished shardsmith "
            "dataset (the conversion did not complete, or this is the wrong folder). "
            "Run the conversion again with --overwrite."
        )
    text = read_bytes(path).decode()
    return schemas.Manifest.from_json(text, path), text


def _dataset_dir_as_option(argv: list[str]) -> list[str]:
    """argv with the dataset folder as `--dataset_dir D`, however it was given.

    The folder comes as the positional DATASET_DIR, or as `--output_dir D`: the folder convert
    wrote, named as convert names it (a hidden alias). Translated here rather than declared on
    `VerifyOptions`: Beam parses every loaded options class together, and `--output_dir` is
    `ConvertOptions`' when both pipelines are imported in one process.
    """
    if argv and not argv[0].startswith("-"):
        return ["--dataset_dir", argv[0], *argv[1:]]
    out = []
    i = 0
    while i < len(argv):
        if argv[i] == _OUTPUT_DIR_ALIAS and i + 1 < len(argv):
            out += ["--dataset_dir", argv[i + 1]]
            i += 2
            continue
        name, sep, value = argv[i].partition("=")
        out.append(f"--dataset_dir={value}" if sep and name == _OUTPUT_DIR_ALIAS else argv[i])
        i += 1
    return out


# convert's name for the dataset folder, which verify also takes (`_dataset_dir_as_option`).
_OUTPUT_DIR_ALIAS = "--output_dir"


def run(argv: list[str] | None = None) -> dict:
    """Verifies a dataset; returns the report (also written as JSON).

    Raises:
      ManifestError: If the folder has no readable manifest.
      ValueError: If --dataset_dir is missing, or an argument is unknown
        (`args.UsageError`).
    """
    options = args.pipeline_options(_dataset_dir_as_option(list(argv or [])), VerifyOptions)
    opts = options.view_as(VerifyOptions)
    if not opts.dataset_dir:
        raise ValueError("Give the dataset folder: python -m beam_jobs.verify DATASET_DIR")
    dataset_dir = opts.dataset_dir.rstrip("/")
    manifest, text = _load_manifest(dataset_dir)
    report_path = opts.report or join(dataset_dir, schemas.VERIFY_REPORT_FILENAME)
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
        + " read, CRC-checked, parsed and decoded"
        + (f"; targets checked: {', '.join(report['targets'])}." if report.get("targets") else ".")
    ]
    if report.get("versions"):
        lines.append("Versions (convert --append): " + ", ".join(
            f"{v['version']} ({sum(map(len, v['shards'].values()))} shards, {v['records']:,} records)"
            for v in report["versions"]) + f"; which shard each wrote: {report.get('report_path', 'the report')}")
    lines += [f"  - {p}" for p in report["problems"][:50]]
    if len(report["problems"]) > 50:
        lines.append(f"  ... and {len(report['problems']) - 50} more: see {report['report_path']}")
    if dup["groups"]:
        across = (f"{dup['across_splits']} of them across splits (a leak between train and evaluation)"
                  if dup["across_splits"] else "none across splits")
        lines.append(
            f"Duplicates: {dup['groups']} group{'s' if dup['groups'] > 1 else ''} of identical images, "
            f"{across}: see {report['report_path']}"
        )
    else:
        lines.append("No duplicate images.")
    return "\n".join(lines)


def help_text() -> str:
    """The text of `shardsmith verify --help`: every option and an example."""

    def add_arguments(parser):
        parser.add_argument("dataset_dir", help="Folder written by the converter.")
        _add_flags(parser)
        _runner.ConsoleOptions._add_argparse_args(parser)

    return args.help_text("shardsmith verify", "Re-read every shard, record and image against the manifest.",
                           _EXAMPLE, add_arguments)


# Verified, except records whose check raised an unexpected error (as convert's exit status 3).
EXIT_CHECKS_FAILED = 3


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 when the dataset matches its manifest, 1 when not, 2 on bad use.

    3 (`EXIT_CHECKS_FAILED`) when the only problems are records whose check
    hit an unexpected error (listed in the report; the rest were verified).
    """
    argv = sys.argv[1:] if argv is None else argv
    with console.entry_point(argv):  # Logging, and quiet C++ libraries.
        return _main(argv)


def _main(argv: list[str]) -> int:
    if args.print_help_if_asked(argv, help_text):
        return 0
    try:
        report = run(argv)
    except (ValueError, FileNotFoundError) as e:  # ManifestError is a ValueError.
        print(f"shardsmith verify: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # The runner wraps errors raised in its steps.
        full = output_full_text(e)  # Its report, written last, found the disk full.
        if full is None:
            raise
        print(f"shardsmith verify: error: {full}: the report was not written; free some space and run "
              "it again.", file=sys.stderr)
        return 1
    print(describe(report))  # The verdict is the result: stdout.
    fail_dups = PipelineOptions(_dataset_dir_as_option(argv)).view_as(VerifyOptions).fail_on_duplicates
    failed_checks = sum(CHECK_FAILED in p for p in report["problems"])
    if failed_checks and failed_checks == len(report["problems"]):
        # Only checks that crashed: nothing is known to be wrong with the data.
        print(f"shardsmith verify: the check of {failed_checks:,} record{'s' if failed_checks > 1 else ''} "
              "hit an error in shardsmith or a decoder; please report it.", file=sys.stderr)
        return EXIT_CHECKS_FAILED
    if not report["ok"] or (fail_dups and report["duplicates"]["across_splits"]):
        return 1
    return 0


if __name__ == "__main__":
    console.exit_program(main())

"""Converts a folder of images into a validated, shuffled, sharded TFRecord dataset.

Locally, on every core:

  python -m beam_jobs.convert \\
      --input_dir ./photos --output_dir ./dataset \\
      --split train=0.8,validation=0.1,test=0.1

On Dataflow (workers install shardsmith from setup.py):

  python -m beam_jobs.convert \\
      --input_dir gs://BUCKET/photos --output_dir gs://BUCKET/dataset \\
      --runner DataflowRunner --project PROJECT --region REGION \\
      --temp_location gs://BUCKET/tmp --setup_file ./setup.py

The input is `ROOT/<class>/...`, `ROOT/<split>/<class>/...` or a flat folder
with a `--labels_csv`. The output folder holds `{split}-{i:05d}-of-{n:05d}.tfrecord`
shards, `rejects.jsonl` (every input not converted, with its reason),
`normalized.jsonl` (every input stored other than byte for byte, with what was
done) and `manifest.json`, written last.

Only paths go through Beam's shuffle: each shard's worker reads, validates and
writes its own images, one at a time, so memory stays bounded whatever the size
of the dataset.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import os
import re
import sys

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, WorkerOptions

import schemas
from schemas.tfds_metadata import TFDS_FILENAMES
from beam_jobs import _listing, _plan, _runner, _shards
from imaging import dicom as _dicom
from shardsmith import console
from shardsmith.progress import ProgressBar
from beam_jobs._tfrecord import TMP_DIRNAME, read_bytes

__all__ = ["ConvertOptions", "ConversionConfig", "ConvertImages", "run", "main"]

_LOG = logging.getLogger("shardsmith.convert")
_MIB = 1 << 20
# Pillow's own decompression-bomb threshold, doubled: generous for real
# photographs and scans, far below what exhausts a worker's memory.
_DEFAULT_MAX_PIXELS = 178_956_970


class ConvertOptions(PipelineOptions):
    """Command-line options of the conversion (Beam's own options come on top)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--input_dir", help="Folder of images (local or a FileSystems URL).")
        parser.add_argument("--output_dir", help="Folder to write the dataset into.")
        parser.add_argument(
            "--labels_csv",
            help="CSV with columns path,label[,split]; paths relative to --input_dir.",
        )
        parser.add_argument(
            "--class_names",
            help="Comma-separated class names in label order (default: sorted names found).",
        )
        parser.add_argument(
            "--split",
            help="Split by a seeded hash of each path, e.g. train=0.8,validation=0.1,test=0.1. "
            "Default: split folders if present, else everything in train.",
        )
        parser.add_argument("--seed", type=int, default=0, help="Seed of every hash (splits, shards, order).")
        parser.add_argument("--num_shards", type=int, help="Shards per split (default: by size).")
        parser.add_argument(
            "--target_shard_mb", type=int, default=128, help="Shard size to aim for, in MiB."
        )
        parser.add_argument(
            "--min_shards", type=int, default=8,
            help="Fewest shards per split (when it has that many images), for parallel reads.",
        )
        parser.add_argument(
            "--max_pixels", type=int, default=_DEFAULT_MAX_PIXELS,
            help="Reject images with more pixels than this (decompression bombs).",
        )
        parser.add_argument(
            "--max_reject_fraction", type=float, default=0.1,
            help="Fail the job when more than this fraction of images is rejected.",
        )
        parser.add_argument(
            "--background", default="255,255,255",
            help="R,G,B colour that transparent images are flattened onto.",
        )
        parser.add_argument(
            "--full_decode", action="store_true",
            help="Validate JPEGs at full resolution instead of libjpeg's 1/8 scale.",
        )
        parser.add_argument(
            "--group_by",
            help="Keep groups in one split: dicom:PatientID, dicom:StudyInstanceUID (any DICOM "
            "keyword), or regex:PATTERN over the relative path (its first group, else the match).",
        )
        parser.add_argument(
            "--dicom_window",
            help="CENTER,WIDTH applied to every greyscale DICOM image (e.g. 40,400); "
            "default: the file's own window.",
        )
        parser.add_argument(
            "--dicom_bit_depth", type=int, default=8,
            help="8, or 16 to keep the windowed range in 16-bit PNGs.",
        )
        parser.add_argument(
            "--dicom_frames", default="first",
            help="Frames of multi-frame DICOM files to keep: first, middle or all (one record each).",
        )
        parser.add_argument(
            "--dicom_tags",
            help="Comma-separated DICOM keywords stored as string features, e.g. Modality,BodyPartExamined.",
        )
        parser.add_argument(
            "--dicom_allow_identifying_tags", action="store_true",
            help="Allow --dicom_tags that identify patients (PatientName, PatientID, ...).",
        )
        parser.add_argument(
            "--dedup", action="store_true",
            help="Keep one copy of identical files (the smallest path); list the others as duplicates.",
        )
        parser.add_argument(
            "--overwrite", action="store_true",
            help="Replace the dataset in a non-empty --output_dir.",
        )
        parser.add_argument(
            "--resume", action="store_true",
            help="Finish an interrupted conversion into --output_dir, keeping its complete shards.",
        )
        parser.add_argument(
            "--worker_threads", type=int, default=None,
            help="Threads of each shard writer that read and validate images ahead "
            "(default: min(4, cores of the worker)). Speed only: the output is the same.",
        )


def _parse_split(text: str) -> dict[str, float]:
    ratios: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        name = _plan.SPLIT_ALIASES.get(name, name)
        try:
            ratio = float(value)
        except ValueError:
            ratio = -1.0
        if not sep or not re.fullmatch(r"[a-z0-9_]+", name) or not 0 <= ratio <= 1 or name in ratios:
            raise ValueError(
                "--split must look like train=0.8,validation=0.1,test=0.1 (names of letters, "
                f"digits and _, each ratio in [0, 1], each name once). Received: {text!r}"
            )
        ratios[name] = ratio
    if not math.isclose(sum(ratios.values()), 1.0, abs_tol=1e-6):
        raise ValueError(f"--split ratios must add up to 1. Received: {text!r} (sum {sum(ratios.values()):g})")
    return ratios


@dataclasses.dataclass(frozen=True)
class ConversionConfig:
    """The validated conversion options.

    Attributes mirror the command-line flags of `ConvertOptions`; see there.
    """

    input_dir: str
    output_dir: str
    labels_csv: str | None = None
    class_names: tuple[str, ...] | None = None
    split_ratios: dict[str, float] | None = None
    seed: int = 0
    num_shards: int | None = None
    target_shard_mb: int = 128
    min_shards: int = 8
    max_pixels: int = _DEFAULT_MAX_PIXELS
    max_reject_fraction: float = 0.1
    background: tuple[int, int, int] = (255, 255, 255)
    full_decode: bool = False
    group_by: str | None = None
    dicom: _dicom.DicomOptions = dataclasses.field(default_factory=_dicom.DicomOptions)
    dedup: bool = False
    overwrite: bool = False
    resume: bool = False
    worker_threads: int | None = None

    def __post_init__(self):
        for name in ("input_dir", "output_dir"):
            if not getattr(self, name):
                raise ValueError(f"--{name} is required.")
        if self.num_shards is not None and self.num_shards < 1:
            raise ValueError(f"--num_shards must be at least 1. Received: {self.num_shards}")
        if self.target_shard_mb < 1:
            raise ValueError(f"--target_shard_mb must be at least 1. Received: {self.target_shard_mb}")
        if self.min_shards < 1:
            raise ValueError(f"--min_shards must be at least 1. Received: {self.min_shards}")
        if self.max_pixels < 1:
            raise ValueError(f"--max_pixels must be at least 1. Received: {self.max_pixels}")
        if self.worker_threads is not None and self.worker_threads < 1:
            raise ValueError(f"--worker_threads must be at least 1. Received: {self.worker_threads}")
        if not 0.0 <= self.max_reject_fraction <= 1.0:
            raise ValueError(
                f"--max_reject_fraction must be in [0, 1]. Received: {self.max_reject_fraction}"
            )
        if len(self.background) != 3 or not all(0 <= c <= 255 for c in self.background):
            raise ValueError(f"--background must be R,G,B in 0-255. Received: {self.background}")
        if self.group_by is not None:
            kind, _, value = self.group_by.partition(":")
            if kind not in ("dicom", "regex") or not value:
                raise ValueError(
                    "--group_by must be dicom:KEYWORD (e.g. dicom:PatientID) or regex:PATTERN. "
                    f"Received: {self.group_by!r}"
                )
            if kind == "regex":
                try:
                    re.compile(value)
                except re.error as e:
                    raise ValueError(f"--group_by regex {value!r} does not compile: {e}.") from None
            elif not _dicom.is_keyword(value):
                raise ValueError(f"--group_by names {value!r}, which is not a DICOM keyword.")
            if self.split_ratios is None:
                raise ValueError(
                    "--group_by keeps each group in one split chosen by hash, so it needs "
                    "--split (e.g. --split train=0.8,validation=0.2)."
                )
        if self.overwrite and self.resume:
            raise ValueError(
                "--overwrite starts the dataset afresh and --resume keeps what an interrupted run "
                "wrote; give one of them."
            )
        if self.class_names is not None:
            dupes = sorted({c for c in self.class_names if self.class_names.count(c) > 1})
            if not self.class_names or dupes or "" in self.class_names:
                raise ValueError(
                    f"--class_names must be distinct, non-empty names. Received: {self.class_names}"
                )
        if _listing.is_local(self.input_dir) and _listing.is_local(self.output_dir):
            src = os.path.realpath(self.input_dir)
            dst = os.path.realpath(self.output_dir)
            if dst == src or dst.startswith(src + os.sep):
                raise ValueError(
                    f"--output_dir {self.output_dir!r} is inside --input_dir {self.input_dir!r}; "
                    "a later run would take the shards for input. Choose another folder."
                )

    @classmethod
    def from_options(cls, options: ConvertOptions) -> ConversionConfig:
        o = options.view_as(ConvertOptions)
        try:
            background = tuple(int(c) for c in o.background.split(","))
        except ValueError:
            raise ValueError(f"--background must be R,G,B in 0-255. Received: {o.background!r}") from None
        dicom = _dicom.DicomOptions(
            window=_dicom.parse_window(o.dicom_window) if o.dicom_window else None,
            bit_depth=o.dicom_bit_depth,
            frames=o.dicom_frames,
            tags=tuple(t.strip() for t in o.dicom_tags.split(",")) if o.dicom_tags else (),
            allow_identifying_tags=o.dicom_allow_identifying_tags,
            max_pixels=o.max_pixels,
        )
        return cls(
            input_dir=o.input_dir,
            output_dir=o.output_dir,
            labels_csv=o.labels_csv,
            class_names=tuple(c.strip() for c in o.class_names.split(",")) if o.class_names else None,
            split_ratios=_parse_split(o.split) if o.split else None,
            seed=o.seed,
            num_shards=o.num_shards,
            target_shard_mb=o.target_shard_mb,
            min_shards=o.min_shards,
            max_pixels=o.max_pixels,
            max_reject_fraction=o.max_reject_fraction,
            background=background,
            full_decode=o.full_decode,
            group_by=o.group_by,
            dicom=dicom,
            dedup=o.dedup,
            overwrite=o.overwrite,
            resume=o.resume,
            worker_threads=o.worker_threads,
        )

    def manifest_options(self, split_source: str) -> dict:
        """The options that shape the output; no paths, so runs compare equal."""
        return {
            "seed": self.seed,
            "split": {"source": split_source, "ratios": self.split_ratios},
            "shard_policy": (
                {"num_shards": self.num_shards}
                if self.num_shards
                else {"target_shard_mb": self.target_shard_mb, "min_shards": self.min_shards}
            ),
            "max_pixels": self.max_pixels,
            "max_reject_fraction": self.max_reject_fraction,
            "background": list(self.background),
            "validation": "full" if self.full_decode else "jpeg_scaled_1_8",
            "dedup": self.dedup,
            "group_by": self.group_by,
            "dicom": {
                "window": list(self.dicom.window) if self.dicom.window else None,
                "bit_depth": self.dicom.bit_depth,
                "frames": self.dicom.frames,
                "tags": list(self.dicom.tags),
            },
            "labels": "csv" if self.labels_csv else "folders",
            "tool_version": schemas.__version__,
        }


class ConvertImages(beam.PTransform):
    """The whole conversion of a plan: shards, rejects, and the manifest last.

    Args:
      plan: The `Plan` of the conversion (labels, splits, shards of each file).
      config: The `ConversionConfig`.
      plan_paths: The shard plan files of `plan` (`_shards.write_shard_plans`).
    """

    def __init__(self, plan: _plan.Plan, config: ConversionConfig, plan_paths: list[str]):
        super().__init__()
        self._plan = plan
        self._config = config
        self._plan_paths = plan_paths

    def expand(self, pbegin):
        plan, config = self._plan, self._config
        written = (
            pbegin
            | "ShardPlans" >> beam.Create(self._plan_paths)  # path of a shard's plan
            | "ImagesToTFRecords" >> _shards.ImagesToTFRecords(
                output_dir=config.output_dir,
                num_classes=len(plan.class_names),
                total_shards=sum(plan.shard_counts.values()),
                max_pixels=config.max_pixels,
                background=config.background,
                full_decode=config.full_decode,
                dedup=config.dedup,
                resume=config.resume,
                dicom=config.dicom,
                worker_threads=config.worker_threads,
            )
        )
        listing_rejects = (
            pbegin
            | "ListingProblems" >> beam.Create(plan.problems, reshuffle=False)
            | "AsRejects" >> beam.Map(_shards.problem_to_reject)  # _shards.Reject
        )
        rejects = (listing_rejects, written[_shards.WriteShardFn.REJECTED]) | "AllRejects" >> beam.Flatten()
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "WriteManifest" >> beam.ParDo(
                _shards.FinalizeFn(
                    output_dir=config.output_dir,
                    class_names=plan.class_names,
                    shard_counts=plan.shard_counts,
                    num_found=plan.num_found,
                    options=config.manifest_options(plan.split_source),
                    max_reject_fraction=config.max_reject_fraction,
                    features=schemas.ImageExampleSchema(
                        extra_string_features=tuple(schemas.dicom_tag_key(t) for t in config.dicom.tags)
                    ).to_json(),
                    extra=_group_section(plan, config),
                ),
                shards=beam.pvalue.AsList(written.shards),
                rejects=beam.pvalue.AsList(rejects),
                normalized=beam.pvalue.AsList(written[_shards.WriteShardFn.NORMALIZED]),
            )
        )


def _prepare_output(config: ConversionConfig) -> None:
    """Refuses a non-empty output unless --overwrite or --resume; clears our own files.

    With --resume the shards, index files and receipts of the interrupted run
    stay; the shard writers keep those that still match.
    """
    out = config.output_dir
    if _listing.is_local(out):
        if os.path.exists(out) and not os.path.isdir(out):
            raise NotADirectoryError(f"--output_dir {out!r} exists and is not a folder.")
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as e:
            raise PermissionError(f"--output_dir {out!r} cannot be created: {e.strerror}.") from e
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(f"--output_dir {out!r} is not writable.")
    existing = FileSystems.match([FileSystems.join(out, "*")])[0].metadata_list
    if existing and not (config.overwrite or config.resume):
        raise FileExistsError(
            f"--output_dir {out!r} is not empty ({len(existing)} entries). Pass --overwrite to "
            "replace the dataset in it, --resume to finish an interrupted conversion, or choose "
            "an empty folder."
        )
    # The manifest goes first: if this run dies, the folder is plainly unfinished.
    names = [schemas.MANIFEST_FILENAME, schemas.REJECTS_FILENAME, schemas.NORMALIZED_FILENAME,
             schemas.VERIFY_REPORT_FILENAME, *TFDS_FILENAMES]
    if not config.resume:
        names.append(TMP_DIRNAME)
    for name in names:
        _shards.delete_if_exists(FileSystems.join(out, name))
    if not config.resume:
        _shards.remove_dataset_files(out)


def build_plan(config: ConversionConfig) -> _plan.Plan:
    """Lists the input and plans the conversion (no image is read)."""
    files, problems = _listing.list_input(config.input_dir)
    if not files and not problems:
        raise FileNotFoundError(f"--input_dir {config.input_dir!r} contains no files.")
    labels_csv = None
    if config.labels_csv:
        if not FileSystems.exists(config.labels_csv):
            raise FileNotFoundError(f"--labels_csv {config.labels_csv!r} does not exist.")
        text = read_bytes(config.labels_csv).decode("utf-8-sig")
        labels_csv = _plan.read_labels_csv(text, config.labels_csv)
    groups = _group_keys(files, config.group_by) if config.group_by else None
    plan = _plan.make_plan(
        files, problems,
        groups=groups,
        seed=config.seed,
        split_ratios=config.split_ratios,
        labels_csv=labels_csv,
        class_names=config.class_names,
        num_shards=config.num_shards,
        target_shard_bytes=config.target_shard_mb * _MIB,
        min_shards=config.min_shards,
    )
    if not plan.files:
        raise ValueError(
            f"--input_dir {config.input_dir!r} has no labelled images: {len(plan.problems)} "
            "files found, none inside a class folder (ROOT/<class>/...) or the labels CSV."
        )
    _LOG.info(
        "Found %s files belonging to %d classes; %s to convert into %s",
        f"{plan.num_found:,}", len(plan.class_names), f"{len(plan.files):,}",
        ", ".join(f"{split} ({n} shards)" for split, n in plan.shard_counts.items()),
    )
    return plan


def _group_section(plan: _plan.Plan, config: ConversionConfig) -> dict:
    if plan.groups is None:
        return {}
    return {"groups": {
        "by": config.group_by,
        "per_split": {split: {"count": len(ids), "sha256_16": list(ids)} for split, ids in plan.groups.items()},
    }}


def _group_keys(files, group_by: str) -> dict[str, str]:
    """Relative path to group value, for the files that have one.

    DICOM headers are read from the first 64 KiB of each file (the whole file
    when the keyword lies further in), on a few threads: the work is I/O.
    """
    kind, _, value = group_by.partition(":")
    if kind == "regex":
        pattern = re.compile(value)
        out = {}
        for f in files:
            m = pattern.search(f.rel_path)
            if m:
                out[f.rel_path] = m.group(1) if m.groups() else m.group(0)
        return out

    def read_key(f):
        try:
            with FileSystems.open(f.path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
                head = fh.read(65536)
                if not _dicom.is_dicom(head[:1024]):
                    return f.rel_path, None
                key = _dicom.read_group_value(head, value)
                if key is None and f.size > len(head):
                    key = _dicom.read_group_value(head + fh.read(), value)
        except OSError:
            return f.rel_path, None  # The shard writer reads it again and says why.
        return f.rel_path, key

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        found = dict(pool.map(read_key, files))
    keyed = {path: key for path, key in found.items() if key}
    _LOG.info("Read %s from %s of %s files (--group_by %s)", value, f"{len(keyed):,}",
              f"{len(files):,}", group_by)
    return keyed


def run(argv: list[str] | None = None, *, wait: bool = True):
    """Runs the conversion.

    Args:
      argv: Command-line arguments (ConvertOptions and Beam's options).
      wait: Wait for the pipeline to finish and log the summary.

    Returns:
      The `PipelineResult`.

    Raises:
      ValueError, FileNotFoundError, FileExistsError, PermissionError: For bad
        arguments, input or output, before any work starts.
    """
    options = PipelineOptions(argv)
    config = ConversionConfig.from_options(options)
    plan = build_plan(config)
    _prepare_output(config)
    runner = _runner.make_runner(options)
    progress = None
    if runner is not None and wait and ProgressBar.wanted():
        # The bar replaces the per-shard lines on a terminal.
        options.view_as(WorkerOptions).sdk_harness_log_level_overrides = {"shardsmith": "WARNING"}
        logging.getLogger("shardsmith.convert").setLevel(logging.WARNING)
        progress = ProgressBar(config.output_dir, len(plan.files), _shards.RECEIPTS_DIRNAME)
        progress.start()
    pipeline = beam.Pipeline(runner=runner, options=options)
    plan_paths = _shards.write_shard_plans(plan.files, config.output_dir)
    _ = pipeline | "ConvertImages" >> ConvertImages(plan, config, plan_paths)
    try:
        result = pipeline.run()
        if wait:
            result.wait_until_finish()
    finally:
        if progress is not None:
            progress.stop()
            logging.getLogger("shardsmith.convert").setLevel(logging.NOTSET)
    if wait:
        _LOG.info("%s", summarize(config.output_dir))
    return result


def summarize(output_dir: str) -> str:
    """One paragraph about a finished dataset, from its manifest."""
    path = FileSystems.join(output_dir, schemas.MANIFEST_FILENAME)
    manifest = schemas.Manifest.from_json(read_bytes(path).decode(), path)
    c = manifest.counts
    shards = sum(len(s.shards) for s in manifest.splits.values())
    per_split = " / ".join(f"{n} {s.num_records:,}" for n, s in manifest.splits.items())
    text = f"Converted {c['written']:,} images into {shards} shards ({per_split})"
    for kind, reasons in (("rejected", schemas.REJECT_REASONS), ("skipped", schemas.SKIP_REASONS)):
        detail = ", ".join(f"{r} {n:,}" for r, n in manifest.rejects.items() if r in reasons)
        text += f"; {kind} {c[kind]:,}" + (f" ({detail})" if detail else "")
    if c["rejected"] or c["skipped"]:
        text += f": see {schemas.REJECTS_FILENAME}"
    if manifest.normalized:
        text += "; normalised " + ", ".join(f"{a} {n:,}" for a, n in manifest.normalized.items())
    text += (
        f". Inputs {c['found']:,} = {c['written']:,} written + {c['rejected']:,} rejected"
        f" + {c['skipped']:,} skipped."
    )
    return text


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs `run` and turns user errors into one sentence."""
    argv = sys.argv[1:] if argv is None else argv
    with console.entry_point(argv):  # Logging, and quiet C++ libraries.
        return _main(argv)


def _main(argv: list[str]) -> int:
    from shardsmith.cli import print_help_if_asked  # The CLI imports this module.

    if print_help_if_asked("convert", argv):
        return 0
    _runner.configure_logging()
    try:
        run(argv)
    except (ValueError, FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError) as e:
        print(f"shardsmith convert: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # The runner wraps errors raised inside workers.
        message = _conversion_error_message(e)
        if message is None:
            raise
        print(f"shardsmith convert: error: {message}", file=sys.stderr)
        return 1
    return 0


def _conversion_error_message(e: BaseException) -> str | None:
    """The ConversionError text inside a runner's wrapped exception, if any."""
    for line in str(e).splitlines():
        if "ConversionError:" in line:
            return line.split("ConversionError:", 1)[1].strip()
    if isinstance(e, _shards.ConversionError):
        return str(e)
    return None


if __name__ == "__main__":
    sys.exit(main())

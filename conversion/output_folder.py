"""The dataset folder: preparing it before a run, clearing stale files, the summary after."""

from __future__ import annotations

import logging
import os

import schemas
from schemas.tfds_metadata import TFDS_FILENAMES
from schemas.volumes import VOLUMES_MANIFEST_FILENAME
from conversion import files
from conversion.files import TMP_DIRNAME, read_bytes

__all__ = ["check_output", "is_finished", "prepare_output", "prepare_append", "remove_dataset_files", "read_manifest", "summarize"]

_LOG = logging.getLogger("shardsmith.convert")


def is_finished(output_dir: str) -> bool:
    """Whether `output_dir` holds a finished dataset: its manifest, written last, is there."""
    return files.exists(files.join(output_dir, schemas.MANIFEST_FILENAME))


def check_output(output_dir: str, *, overwrite: bool, resume: bool) -> None:
    """Refuses an output that is a file, or not empty without --overwrite or --resume; changes nothing.

    Raises:
      NotADirectoryError, FileExistsError: Naming the flag.
    """
    out = output_dir
    if files.is_local(out):
        if os.path.exists(out) and not os.path.isdir(out):
            raise NotADirectoryError(f"--output_dir {out!r} exists and is not a folder.")
        if not os.path.exists(out):
            return
    if overwrite or resume:
        return
    existing = files.match(files.join(out, "*"))
    if existing:
        raise FileExistsError(
            f"--output_dir {out!r} is not empty ({len(existing)} entries). Pass --overwrite to "
            "replace the dataset in it, --resume to finish an interrupted conversion, or choose "
            "an empty folder."
        )


def prepare_output(output_dir: str, *, overwrite: bool, resume: bool) -> None:
    """Refuses a non-empty output unless --overwrite or --resume; clears our own files.

    With --resume the shards, index files and receipts of the interrupted run
    stay; the shard writers keep those that still match.

    Raises:
      NotADirectoryError, PermissionError, FileExistsError: Naming the flag.
    """
    check_output(output_dir, overwrite=overwrite, resume=resume)
    out = output_dir
    if files.is_local(out):
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as e:
            raise PermissionError(f"--output_dir {out!r} cannot be created: {e.strerror}.") from e
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(f"--output_dir {out!r} is not writable.")
    # The manifest goes first: if this run dies, the folder is plainly unfinished.
    names = [schemas.MANIFEST_FILENAME, VOLUMES_MANIFEST_FILENAME, schemas.REJECTS_FILENAME,
             schemas.NORMALIZED_FILENAME, schemas.VERIFY_REPORT_FILENAME, *TFDS_FILENAMES]
    if not resume:
        names.append(TMP_DIRNAME)
    for name in names:
        files.remove_tree(files.join(out, name))
    if not resume:
        remove_dataset_files(out)
        _remove_inventories(out)


def _remove_inventories(output_dir: str) -> None:
    """Deletes an earlier dataset's inventories (`conversion.append`): a new dataset starts at version 1."""
    from conversion import append as _append

    for path in files.match(files.join(output_dir, "*")):
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if _append.INPUTS_FILE_RE.match(name) or name == _append.REPORT_FILENAME:
            files.remove(path)


def prepare_append(output_dir: str, keep, *, resume: bool) -> list[str]:
    """Readies a dataset folder for an append; the manifest and every file it names stay.

    Removes what an append killed before its manifest left: shard and index
    files the manifest does not name (`keep`: those it names), and, without
    --resume, the temporary folder (with --resume its receipts keep the shards
    that run finished, and those shards stay).

    Returns:
      The names of the files removed.
    """
    if resume:
        return []
    files.remove_tree(files.join(output_dir, TMP_DIRNAME))
    return remove_dataset_files(output_dir, keep=keep)


def remove_dataset_files(output_dir: str, keep=frozenset()) -> list[str]:
    """Deletes shards not in `keep`, so no stale file looks part of the dataset."""
    removed = []
    for path in files.match(files.join(output_dir, "*")):
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if schemas.manifest.SHARD_FILENAME_RE.match(name) and name not in keep:
            files.remove(path)
            removed.append(name)
    if removed:
        _LOG.info("Removed %d shard files of an earlier dataset or an unfinished run", len(removed))
    return removed


def read_manifest(output_dir: str) -> schemas.Manifest:
    """The manifest of a finished dataset."""
    path = files.join(output_dir, schemas.MANIFEST_FILENAME)
    return schemas.Manifest.from_json(read_bytes(path).decode(), path)


def summarize(output_dir: str) -> str:
    """One paragraph about a finished dataset, from its manifest."""
    manifest = read_manifest(output_dir)
    c = manifest.counts
    shards = sum(len(s.shards) for s in manifest.splits.values())
    per_split = " / ".join(f"{n} {s.num_records:,}" for n, s in manifest.splits.items())
    records = sum(s.num_records for s in manifest.splits.values())
    new = ""
    if manifest.versions:
        # A dataset that grew (convert --append): the counts are the last run's, its new shards.
        latest = manifest.versions[-1]
        shards = sum(len(f) for f in latest.shards.values())
        per_split = " / ".join(f"{n} {latest.num_records.get(n, 0):,}" for n in manifest.splits)
        records = sum(latest.num_records.values())
        new = "new "
    # A multi-frame DICOM or multi-page raster gives one record per frame/page:
    # then files and records differ, and the line says both.
    # Volumes: the inputs are a series' files, each record one volume.
    noun, made_of = ("file", "volume") if "volumes" in manifest.extra else ("image", "record")
    made = "" if records == c["written"] and noun == "image" else f" as {_count(records, made_of)}"
    text = f"Converted {_count(c['written'], noun)}{made} into {_count(shards, new + 'shard')} ({per_split})"
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


def _count(n: int, noun: str) -> str:
    """'1 image', '2 images', '1,000 images': the summary reads as a sentence."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")

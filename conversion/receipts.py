"""Resume receipts: one small JSON file per finished shard, and the fingerprint that keys it.

A receipt keeps what the manifest needs of a written shard; `--resume` takes
it instead of writing the shard again when the shard's fingerprint (its
planned files and the options its bytes depend on) and the files' hashes are
unchanged. Beam-free, through `conversion.files`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

from conversion.elements import Reject, ShardResult
from conversion.files import TMP_DIRNAME, exists, join, read_bytes, write_atomically
from conversion.shard_writer import ShardOutcome
from imaging import ValidationOptions

__all__ = ["RECEIPTS_DIRNAME", "Receipts", "validation_fingerprint", "shard_fingerprint"]

# Inside the temporary folder: one receipt per finished shard, for --resume.
RECEIPTS_DIRNAME = "done"


def validation_fingerprint(validation: ValidationOptions) -> str:
    """The text of the options a shard's bytes depend on (kept as receipts of older runs wrote it)."""
    args = dict(max_pixels=validation.max_pixels, background=validation.background,
                full_decode=validation.full_decode, dicom=validation.dicom)
    if validation.resize.active:  # Absent otherwise, as receipts of older runs have it.
        args["resize"] = validation.resize
    if not validation.raster.is_default:
        # Only then: receipts of runs without raster options stay valid.
        args["raster"] = validation.raster
    return repr(sorted(args.items()))


class Receipts:
    """One small JSON file per finished shard, in the temporary folder, for --resume."""

    def __init__(self, output_dir: str):
        self._output_dir = output_dir
        self._folder = join(output_dir, TMP_DIRNAME, RECEIPTS_DIRNAME)

    def save(self, name, fingerprint, outcome):
        result, rejects, normalized = outcome
        receipt = {
            "fingerprint": fingerprint,
            "result": dataclasses.asdict(result),
            "rejects": [dataclasses.astuple(r) for r in rejects],
            "normalized": [[p, src, list(actions), details] for p, src, actions, details in normalized],
        }
        text = json.dumps(receipt, sort_keys=True, ensure_ascii=True)
        write_atomically(self._folder, name + ".json", text.encode("utf-8", "surrogateescape"))

    def load(self, name, fingerprint):
        """The saved outcome of a shard, if its files are still exactly as written."""
        path = join(self._folder, name + ".json")
        if not exists(path):
            return None
        receipt = json.loads(read_bytes(path).decode("utf-8", "surrogateescape"))
        if receipt["fingerprint"] != fingerprint:
            return None
        fields = receipt["result"]
        fields["class_counts"] = tuple(fields["class_counts"])
        result = ShardResult(**fields)
        for file_name, sha in ((result.file, result.sha256), (result.index_file, result.index_sha256)):
            path = join(self._output_dir, file_name)
            if not exists(path) or hashlib.sha256(read_bytes(path)).hexdigest() != sha:
                return None
        rejects = [Reject(*r) for r in receipt["rejects"]]
        normalized = [(p, src, tuple(actions), details) for p, src, actions, details in receipt["normalized"]]
        return ShardOutcome(result, rejects, normalized)


def shard_fingerprint(validation: ValidationOptions, files) -> str:
    """What the shard's bytes depend on: its planned files and the validation options.

    The worker threads change speed only, never the bytes: not part of it.
    A file's targets (its mask's path and dtype among them) are part of it.
    """
    h = hashlib.sha256(validation_fingerprint(validation).encode())
    for f in files:
        h.update(repr((os.fsencode(f.rel_path), f.size, f.label, f.order, f.duplicate_of)).encode())
        if f.targets is not None:  # Only then: shards without targets keep their receipts' fingerprints.
            h.update(f.targets.encode())
        if f.patch_rows is not None:  # Only then, likewise.
            h.update(f"patch_rows:{f.patch_rows}".encode())
    return h.hexdigest()

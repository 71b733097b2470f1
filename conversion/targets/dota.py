"""DOTA oriented boxes (v1.0, v1.5, v2.0): --annotations a labelTxt folder, one text file per image.

Each file is named by its image's stem (`labelTxt/P0001.txt` for
`images/P0001.png`) and holds, after optional header lines (`imagesource:...`,
`gsd:...`, DOTA v1.0's), one object a line:

    x1 y1 x2 y2 x3 y3 x4 y4 class difficult

the 4 corners in pixels of the image, clockwise on the image from the first
point DOTA's annotators gave, the class a name (`large-vehicle`) and
`difficult` 0 or 1 (as DOTA's devkit reads it, a line without it is not
difficult). Class names are the sorted names the files use, or --class_names
(then a name outside them rejects its image). A line that is none of these
(another count of fields, a corner that is not a number, difficult neither 0
nor 1) rejects its image ('bad_target', naming the file and line). A file
whose stem is the stem of no listed image, or of several, is counted
('unknown_image', 'ambiguous_stem'); images without a file are no images of
the annotations (skipped, 'no_label').
"""

from __future__ import annotations

import collections
import logging
import math
import posixpath
from collections.abc import Sequence

from conversion.files import read_bytes, read_many
from conversion.targets._box_files import BoxAnnotations, Index, some

__all__ = ["DOTA_FORMAT", "looks_like_dota", "read_dota"]

_LOG = logging.getLogger("shardsmith.convert")
DOTA_FORMAT = "dota"
# Header lines of DOTA v1.0's files (one 'key:value' token): not objects.
_HEADERS = ("imagesource:", "gsd:")
# Label files looked at to tell a DOTA folder from YOLO labels, at most.
_SNIFFED = 3


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _is_header(fields: list[str]) -> bool:
    return len(fields) == 1 and fields[0].lower().startswith(_HEADERS)


def _label_files(found) -> list:
    return [f for f in found if f.rel_path.lower().endswith(".txt") and posixpath.basename(f.rel_path) != "classes.txt"]


def looks_like_dota(found) -> bool:
    """Whether a folder's listed files (`listing.InputFile`s) are DOTA labels, by content.

    A DOTA file starts with a header line or an object line of 8 numbers then
    a class name; YOLO's lines are numbers only. The first non-empty files
    of the folder decide (a few reads).
    """
    for f in _label_files(found)[:_SNIFFED]:
        try:
            text = read_bytes(f.path).decode("utf-8-sig", "replace")
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split()
            if not fields:
                continue
            if _is_header(fields):
                return True
            return len(fields) in (9, 10) and all(map(_is_number, fields[:8])) and not _is_number(fields[8])
    return False


def read_dota(found, source: str, listed: Sequence[str], class_names=None) -> BoxAnnotations:
    """Reads a DOTA labelTxt folder and matches each file to the listed image of its stem.

    Args:
      found: The folder's listed files (`listing.InputFile`s), sorted.
      source: --annotations, for messages.
      listed: Relative paths under --input_dir (files and problems).
      class_names: --class_names: the classes in label order, in place of the sorted names found.

    Returns:
      Oriented boxes: each file's 'boxes' are [line, x1, y1, ..., x4, y4,
      label, difficult], in pixels of the image.
    """
    index = Index(listed)
    issues = collections.Counter()
    parsed, invalid, unknown = {}, {}, []
    files = _label_files(found)
    # Read on threads (a request each on cloud storage), in the listing's order.
    texts = read_many([f.path for f in files])
    for f, data in zip(files, texts):
        stem = posixpath.splitext(posixpath.basename(f.rel_path))[0]
        images = index.by_stem.get(stem, [])
        if len(images) != 1:
            if images:
                issues["ambiguous_stem"] += 1
                _LOG.warning("--annotations %s: %s names %d images of stem %r (%s); its boxes are not read",
                             source, f.rel_path, len(images), stem, some(images))
            else:
                unknown.append(f.rel_path)
            continue
        rel = images[0]
        if rel in parsed or rel in invalid:
            issues["duplicate_image"] += 1
            continue
        if isinstance(data, OSError):
            invalid[rel] = f"label file {f.rel_path} cannot be read ({data.strerror or data})"
            continue
        lines = _lines(data, f.rel_path, issues)
        if isinstance(lines, str):
            invalid[rel] = lines
        else:
            parsed[rel] = lines
    if unknown:
        issues["unknown_image"] += len(unknown)
        _LOG.warning("--annotations %s: %d label files name no image under --input_dir: %s",
                     source, len(unknown), some(unknown))
    names = tuple(class_names) if class_names is not None else tuple(sorted(
        {line[9] for lines in parsed.values() for line in lines}))
    label_of = {name: i for i, name in enumerate(names)}
    entries = {}
    for rel, lines in parsed.items():
        bad = next((line for line in lines if line[9] not in label_of), None)
        if bad is not None:
            invalid[rel] = (f"label file {bad[11]} line {bad[0]}: class {bad[9]!r} is not among --class_names "
                            f"({some(list(names))})")
            continue
        entries[rel] = {"size": None, "ref": "line", "dropped": [],
                        "boxes": [[line[0], *line[1:9], label_of[line[9]], line[10]] for line in lines]}
    return BoxAnnotations(DOTA_FORMAT, names, None, entries, (), invalid, dict(issues),
                          sources=frozenset(f.path for f in files))


def _lines(data: bytes, label: str, issues) -> list | str:
    """[[line, x1..y4, class name, difficult, file]] of a DOTA file, or why it is refused."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return f"label file {label} is not UTF-8 text ({e})"
    out, seen = [], set()
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or _is_header(fields):
            continue
        where = f"label file {label} line {number}"
        if len(fields) not in (9, 10):
            return (f"{where}: {len(fields)} fields; a DOTA object is 'x1 y1 x2 y2 x3 y3 x4 y4 class "
                    "difficult' (10, or 9 without difficult)")
        try:
            corners = [float(v) for v in fields[:8]]
        except ValueError:
            return f"{where}: a corner is not a number in {line.strip()!r}"
        if not all(map(math.isfinite, corners)):
            return f"{where}: a corner is not a finite number in {line.strip()!r}"
        difficult = fields[9] if len(fields) == 10 else "0"
        if difficult not in ("0", "1"):
            return f"{where}: difficult {difficult!r} is not 0 or 1"
        key = (*corners, fields[8], difficult)
        if key in seen:
            # A line repeated (an exporter run twice): kept once, as the YOLO reader does.
            issues["duplicate_line"] += 1
            continue
        seen.add(key)
        out.append([number, *corners, fields[8], int(difficult), label])
    return out

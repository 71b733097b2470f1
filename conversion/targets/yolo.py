"""YOLO box labels (Ultralytics, Darknet): --annotations a labels folder or a data.yaml file.

A YOLO dataset keeps one text file per image, `class cx cy w h` a line, the
box's centre and size as fractions of the upright image (Ultralytics reads
each photo turned upright by its EXIF orientation and measures it so), and
its class names apart from the labels:

- a labels folder (`labels/train/x.txt` for `images/train/x.jpg`, or the
  label files next to the images, LabelImg's way), names from a
  `classes.txt` in that folder (one name a line, line k is class k) or
  --class_names;
- a `data.yaml` (Ultralytics): `names` (a list, or a map of class ids
  0..n-1 to names), `path` (the dataset root; relative: to the current
  folder, else to the YAML's folder) and `train`, `val` (or `validation`),
  `test`: folders of images, text files listing images, or lists of those.
  Each image's split is the key it comes under.

An image's label file is where Ultralytics looks for it: its path with the
last `/images/` turned into `/labels/` and its suffix into `.txt`; else the
file of its own path under the labels folder. Every image is the dataset's:
one without a label file is a background image (no boxes). A line Ultralytics
would refuse rejects its image ('bad_target', with the file and line); a
line of more than 5 numbers is a polygon (a segmentation label), boxed by
its points' extent as Ultralytics boxes it. Label files of no image are
counted ('unknown_image', as COCO's annotations of unknown images).

With --boxes oriented (`oriented=True`) the lines are Ultralytics' oriented
boxes (YOLO-OBB, its `-obb` models and `dota8`): 'class x1 y1 x2 y2 x3 y3 x4
y4', the 4 corners as fractions, kept in their order
(`conversion.targets.oriented`); any other line, a 'class cx cy w h' box
among them, rejects its image. Without the flag such a line stays what it
always was here, a 4-point polygon boxed by its extent: the two cannot be
told apart by their numbers.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import posixpath
from collections.abc import Mapping, Sequence

from conversion import listing as _listing
from conversion.files import exists, read_bytes, read_many
from conversion.targets._box_files import BoxAnnotations, some
from schemas.manifest import SPLIT_ALIASES

__all__ = ["YOLO_FORMAT", "YOLO_OBB_FORMAT", "is_data_yaml", "read_yolo"]

_LOG = logging.getLogger("shardsmith.convert")
YOLO_FORMAT = "yolo"
# Ultralytics' oriented boxes, 'class x1 y1 x2 y2 x3 y3 x4 y4' (--boxes oriented).
YOLO_OBB_FORMAT = "yolo_obb"
# Coordinates a little outside [0, 1] are rounding, not mistakes: Ultralytics accepts 1% either side.
_TOLERANCE = 0.01
# The file of class names in a labels folder (Darknet, LabelImg): never an image's labels.
_CLASSES_TXT = "classes.txt"
# Listed files that are a YOLO dataset's own files, not its images (labels, names, Ultralytics' caches).
_NOT_IMAGES = (".txt", ".yaml", ".yml", ".cache", ".json", ".xml", ".csv")
# data.yaml's keys of image sources, in the order they are read; 'validation' is Ultralytics' other name of 'val'.
_SPLIT_KEYS = ("train", "val", "validation", "test")


def is_data_yaml(path: str) -> bool:
    """Whether --annotations names a YOLO data YAML file (by its suffix)."""
    return path.lower().endswith((".yaml", ".yml"))


@dataclasses.dataclass(frozen=True)
class _Sources:
    """Where a data.yaml's images of each split are: folders and listed files."""

    folders: tuple[tuple[str, str], ...]  # (full folder path, split)
    images: Mapping[str, str]  # full image path -> split
    named: tuple[str, ...]  # Every folder and list file, for messages.


def read_yolo(annotations: str, input_dir: str, files: Sequence[str], class_names=None,
              found: Sequence | None = None, listed: Sequence[str] = (), oriented: bool = False,
              ) -> tuple[BoxAnnotations, Mapping[str, str] | None]:
    """Reads YOLO labels for the images among `files`.

    Args:
      annotations: --annotations: a labels folder, or a data.yaml file.
      input_dir: --input_dir (the listed files are relative to it).
      files: The listed examples' relative paths.
      class_names: --class_names, used when neither data.yaml nor classes.txt names the classes.
      found: The labels folder's `listing.InputFile`s, when already listed.
      listed: Every listed path (problems and, with --append, the held
        files too): their label files are no label files of no image.
      oriented: Read Ultralytics' oriented boxes (YOLO-OBB, --boxes oriented):
        each line 'class x1 y1 x2 y2 x3 y3 x4 y4', planned as [line, x1, y1,
        ..., x4, y4, label, 0]; a line of another count (a 'class cx cy w h'
        box among them) rejects its image.

    Returns:
      (the boxes, relative path -> split of each image a data.yaml's keys
      place, or None for a labels folder).

    Raises:
      ValueError: For a data.yaml that cannot be used, class names given
        twice or nowhere.
    """
    root = _listing.full_path(input_dir)
    images = [rel for rel in files if not rel.lower().endswith(_NOT_IMAGES)]
    if is_data_yaml(annotations):
        names, splits, labels = _from_data_yaml(annotations, input_dir, root, images, class_names)
        images, labels_folder = sorted(splits), None
    else:
        names, labels = _from_folder(annotations, class_names, found)
        splits, labels_folder = None, _listing.full_path(annotations)
    all_labels = labels
    labels = {path: f for path, f in labels.items()
              if path.lower().endswith(".txt") and posixpath.basename(path) != _CLASSES_TXT}
    issues = collections.Counter()
    entries, invalid = {}, {}
    label_of = {rel: _label_of(_join(root, rel), rel, labels, labels_folder) for rel in images}
    used = set(label_of.values()) - {None}
    # Read on threads (a request each on cloud storage), in the images' order.
    with_labels = [rel for rel in images if label_of[rel] is not None]
    texts = dict(zip(with_labels, read_many([labels[label_of[rel]].path for rel in with_labels])))
    for rel in images:
        label = label_of[rel]
        entry = {"size": None, "ref": "line", "units": "fraction", "boxes": [], "dropped": []}
        if label is None:
            issues["no_label_file"] += 1
            entries[rel] = entry
            continue
        data = texts[rel]
        if isinstance(data, OSError):
            error = f"label file {_shown(label, root)} cannot be read ({data.strerror or data})"
        else:
            read = _read_obb_lines if oriented else _read_lines
            error = read(data, _shown(label, root), len(names), entry, issues)
        if error is None:
            entries[rel] = entry
        else:
            invalid[rel] = error
    for rel in set(listed) - set(images):
        used.add(_label_of(_join(root, rel), rel, labels, labels_folder))
    unknown = sorted(set(labels) - used)
    if unknown:
        issues["unknown_image"] += len(unknown)
        _LOG.warning("--annotations %s: %d label files name no image under --input_dir: %s",
                     annotations, len(unknown), some(unknown))
    form = YOLO_OBB_FORMAT if oriented else YOLO_FORMAT
    return BoxAnnotations(form, names, None, entries, (), invalid, dict(issues), frame="upright",
                          sources=frozenset(f.path for f in all_labels.values())), splits


def _from_data_yaml(annotations: str, input_dir: str, root: str, images: Sequence[str], class_names):
    """(class names, relative path -> split of each image it places, full path -> listed file of the labels)."""
    names, doc = _data_yaml(annotations)
    if class_names is not None:
        raise ValueError(f"--class_names is not needed with --annotations {annotations}: its 'names' "
                         "are the box classes. Drop --class_names.")
    splits = {}
    for dataset_root in _roots(doc, annotations):
        sources = _sources(doc, annotations, dataset_root)
        splits = {rel: split for rel in images if (split := _split_of(_join(root, rel), sources))}
        if splits:
            break
    if not splits:
        where = [n for r in _roots(doc, annotations) for n in _sources(doc, annotations, r).named]
        raise ValueError(f"--annotations {annotations}: none of the images under --input_dir {input_dir} "
                         f"is among its train/val/test images ({some(where)}). Give the folder that "
                         "holds them as --input_dir.")
    # The labels' folders, to find the label files of no image: those of the image folders that hold
    # an image of --input_dir (a run of one split folder counts no other split's labels), and those
    # of the images the list files name.
    placed = [_join(root, rel) for rel in splits]
    folders = [f for f, _ in sources.folders if any(p.startswith(f.rstrip("/") + "/") for p in placed)]
    label_roots = sorted({posixpath.dirname(_label_path(f + "/x")) for f in folders}
                         | {posixpath.dirname(_label_path(p)) for p in sources.images})
    labels = {}
    for label_root in label_roots:
        if exists(label_root):
            labels.update({_join(label_root, f.rel_path): f for f in _listed(label_root)})
    return names, splits, labels


def _from_folder(annotations: str, class_names, found):
    """(class names, full path -> listed file of the labels) of a labels folder."""
    listed = list(found) if found is not None else _listed(annotations)
    names = _classes_txt(annotations, listed)
    if names is None and class_names is None:
        raise ValueError(
            f"--annotations {annotations} is a folder of YOLO labels without class names: give the "
            f"dataset's data.yaml as --annotations, put a {_CLASSES_TXT} (one name a line) in the "
            "labels folder, or give --class_names.")
    if names is not None and class_names is not None:
        raise ValueError(f"--class_names is not needed: {_CLASSES_TXT} in --annotations {annotations} "
                         "names the box classes. Drop --class_names.")
    folder = _listing.full_path(annotations)
    return tuple(names if names is not None else class_names), {_join(folder, f.rel_path): f for f in listed}


def _listed(folder: str) -> list:
    found, _ = _listing.list_input(folder)
    return found


def _join(folder: str, rel: str) -> str:
    return folder.rstrip("/") + "/" + rel


def _label_path(image: str) -> str:
    """Where Ultralytics looks for an image's labels: the last '/images/' made '/labels/', the suffix '.txt'."""
    head, sep, tail = image.rpartition("/images/")
    path = head + "/labels/" + tail if sep else image
    return posixpath.splitext(path)[0] + ".txt"


def _label_of(image: str, rel: str, labels: Mapping, labels_folder: str | None) -> str | None:
    """The label file of an image (full paths): Ultralytics' place, else its own path under the labels folder."""
    candidates = [_label_path(image)]
    if labels_folder is not None:
        candidates.append(_join(labels_folder, posixpath.splitext(rel)[0] + ".txt"))
    return next((c for c in candidates if c in labels), None)


def _shown(label: str, root: str) -> str:
    """A label file's path for messages: from the folder it shares with --input_dir
    (`labels/val/x.txt` beside `images/val`), as the rejects name images; else as given."""
    ours, theirs = label.split("/"), root.rstrip("/").split("/")
    common = 0
    while common < min(len(ours) - 1, len(theirs)) and ours[common] == theirs[common]:
        common += 1
    return "/".join(ours[common:]) if any(ours[:common]) else label


def _classes_txt(annotations: str, listed) -> tuple[str, ...] | None:
    """The names in the labels folder's classes.txt (blank lines at the end ignored), or None without one."""
    top = [f for f in listed if f.rel_path == _CLASSES_TXT]
    if not top:
        return None
    text = read_bytes(top[0].path).decode("utf-8-sig")
    names = [line.strip() for line in text.splitlines()]
    while names and not names[-1]:
        names.pop()
    if not names or "" in names:
        raise ValueError(f"{_CLASSES_TXT} in --annotations {annotations} must name one class a line, "
                         f"none empty. Received: {names}")
    return tuple(names)


def _read_lines(data: bytes, label: str, num_classes: int, entry: dict, issues) -> str | None:
    """Adds a label file's boxes to `entry` (corners as fractions); returns why the file is refused, or None."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return f"label file {label} is not UTF-8 text ({e})"
    seen = set()
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        where = f"label file {label} line {number}"
        if len(fields) < 5 or (len(fields) > 5 and len(fields) % 2 == 0):
            return (f"{where}: {len(fields)} fields; a box is 'class cx cy w h' (5), a polygon 'class x1 y1 "
                    "x2 y2 x3 y3 ...' (an odd number, 7 or more)")
        parsed = _class_and_numbers(fields, line, where, num_classes)
        if isinstance(parsed, str):
            return parsed
        label_id, values = parsed
        if (label_id, *values) in seen:
            # A line repeated (an exporter run twice): Ultralytics drops the copy, and so do we.
            issues["duplicate_line"] += 1
            continue
        seen.add((label_id, *values))
        if len(values) == 4:
            cx, cy, w, h = values
            if not (w > 0 and h > 0):
                return f"{where}: width {fields[3]} and height {fields[4]} must be above 0"
            if not all(-_TOLERANCE <= v <= 1 + _TOLERANCE for v in (cx, cy, w, h)):
                return (f"{where}: centre ({fields[1]}, {fields[2]}) or size ({fields[3]}, {fields[4]}) is "
                        "outside [0, 1]: YOLO labels are fractions of the image's width and height")
            box = [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]
        else:
            if not all(-_TOLERANCE <= v <= 1 + _TOLERANCE for v in values):
                return (f"{where}: a polygon point is outside [0, 1]: YOLO labels are fractions of the "
                        "image's width and height")
            xs, ys = values[0::2], values[1::2]
            box = [min(xs), min(ys), max(xs), max(ys)]
            issues["bbox_from_segmentation"] += 1
        entry["boxes"].append([number, *box, int(label_id), 0])
        # The region it draws (`conversion.annotation_masks`): a polygon's points, or its box.
        entry.setdefault("regions", []).append(["polygons", [values]] if len(values) > 4 else None)
    return None


def _class_and_numbers(fields, line: str, where: str, num_classes: int) -> tuple[float, list[float]] | str:
    """A label line's class id and its numbers (a box's, a polygon's, an oriented box's corners), or why
    the line is refused: a field that is not a finite number, a class id not among the classes."""
    try:
        label_id = float(fields[0])
        values = [float(v) for v in fields[1:]]
    except ValueError:
        return f"{where}: not a number in {line.strip()!r}"
    if not all(math.isfinite(v) for v in (label_id, *values)):
        return f"{where}: not a finite number in {line.strip()!r}"
    if not label_id.is_integer() or not 0 <= label_id < num_classes:
        return f"{where}: class {fields[0]} is not one of the {num_classes} classes (0-{num_classes - 1})"
    return label_id, values


def _read_obb_lines(data: bytes, label: str, num_classes: int, entry: dict, issues) -> str | None:
    """Adds a YOLO-OBB label file's oriented boxes to `entry` (corners as fractions); returns why
    the file is refused, or None."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return f"label file {label} is not UTF-8 text ({e})"
    seen = set()
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        where = f"label file {label} line {number}"
        if len(fields) != 9:
            kind = " (an axis box 'class cx cy w h': a dataset mixes boxes and oriented boxes)" \
                if len(fields) == 5 else ""
            return (f"{where}: {len(fields)} fields{kind}; with --boxes oriented a line is an oriented box "
                    "'class x1 y1 x2 y2 x3 y3 x4 y4' (9)")
        parsed = _class_and_numbers(fields, line, where, num_classes)
        if isinstance(parsed, str):
            return parsed
        label_id, values = parsed
        if not all(-_TOLERANCE <= v <= 1 + _TOLERANCE for v in values):
            return (f"{where}: a corner is outside [0, 1]: YOLO-OBB labels are fractions of the image's "
                    "width and height")
        if (label_id, *values) in seen:
            issues["duplicate_line"] += 1
            continue
        seen.add((label_id, *values))
        entry["boxes"].append([number, *values, int(label_id), 0])
    return None


def _data_yaml(path: str) -> tuple[tuple[str, ...], dict]:
    """(class names, the document) of an Ultralytics data YAML file."""
    import yaml  # Only with a data.yaml: not on every run.

    try:
        doc = yaml.safe_load(read_bytes(path).decode("utf-8-sig"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"--annotations {path} is not a YAML file ({e}).") from None
    if not isinstance(doc, dict):
        raise ValueError(f"--annotations {path} must be an Ultralytics data YAML mapping with 'names' and "
                         "'train'/'val'.")
    return _names(doc, path), doc


def _names(doc: dict, path: str) -> tuple[str, ...]:
    """`names` as Ultralytics reads it: a list, or a map of the ids 0..n-1; else nc's class_0, class_1, ..."""
    names, nc = doc.get("names"), doc.get("nc")
    if names is None:
        if isinstance(nc, int) and not isinstance(nc, bool) and nc > 0:
            return tuple(f"class_{i}" for i in range(nc))
        raise ValueError(f"--annotations {path} names no classes: give it 'names' (a list, or a map of "
                         "class ids to names).")
    if isinstance(names, list):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        raise ValueError(f"--annotations {path}: 'names' must be a list or a map of class ids to names. "
                         f"Received: {names!r}")
    try:
        by_id = {int(k): str(v) for k, v in names.items()}
    except (TypeError, ValueError):
        raise ValueError(f"--annotations {path}: the keys of 'names' must be class ids 0, 1, ... "
                         f"Received: {sorted(map(str, names))}") from None
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError(f"--annotations {path}: a dataset of {len(by_id)} classes has the class ids "
                         f"0-{len(by_id) - 1} (as Ultralytics requires). Received: {sorted(by_id)}")
    if nc is not None and nc != len(by_id):
        raise ValueError(f"--annotations {path}: 'nc: {nc}' and the {len(by_id)} 'names' disagree.")
    return tuple(by_id[i] for i in range(len(by_id)))


def _roots(doc: dict, path: str) -> list[str]:
    """The dataset roots to try, first to last: its 'path' as Ultralytics resolves it, then the YAML's folder.

    Ultralytics takes a relative 'path' under the current folder where it is
    there, else under its own datasets folder (a setting of its own, not read
    here): the YAML's folder stands in for that one, and for a 'path' whose
    folder holds none of the images (a 'path: .' run from elsewhere).
    """
    here = posixpath.dirname(_listing.full_path(path))
    root = doc.get("path")
    if not root:
        return [here]
    root = str(root)
    if _is_absolute(root):
        return [_listing.full_path(root)]
    under_cwd = _listing.full_path(root)
    roots = [under_cwd] if _listing.is_local(path) and exists(under_cwd) else []
    return list(dict.fromkeys(roots + [posixpath.normpath(_join(here, root)), here]))


def _sources(doc: dict, path: str, root: str) -> _Sources:
    """The image sources of the YAML's split keys under the dataset root, as Ultralytics resolves them."""
    folders, images, named = [], {}, []
    seen = False
    for key in _SPLIT_KEYS:
        value = doc.get(key)
        if not value or (key == "validation" and doc.get("val")):
            continue
        seen = True
        split = SPLIT_ALIASES[key]
        for entry in (value if isinstance(value, list) else [value]):
            source = _resolve(root, str(entry))
            named.append(source)
            if source.lower().endswith(".txt"):
                for image in _image_list(source, path):
                    images.setdefault(image, split)
            else:
                folders.append((source, split))
    if not seen:
        raise ValueError(f"--annotations {path} has no 'train', 'val' or 'test' images.")
    return _Sources(tuple(folders), images, tuple(dict.fromkeys(named)))


def _is_absolute(path: str) -> bool:
    return path.startswith("/") or not _listing.is_local(path) or os.path.isabs(path)


def _resolve(root: str, value: str) -> str:
    """A split key's path: under the root; a '../' one that is not there, under the root all the same."""
    if _is_absolute(value):
        return _listing.full_path(value)
    found = posixpath.normpath(_join(root, value))
    if not exists(found) and value.startswith("../"):
        found = posixpath.normpath(_join(root, value[3:]))
    return found


def _image_list(source: str, path: str) -> list[str]:
    """The images a list file names (one a line): './' lines are under its folder, others as given; none
    when it is not there (under another dataset root it may be)."""
    if not exists(source):
        return []
    folder = posixpath.dirname(source)
    out = []
    for line in read_bytes(source).decode("utf-8-sig").splitlines():
        line = line.strip()
        if not line:
            continue
        out.append(posixpath.normpath(_join(folder, line[2:])) if line.startswith("./") else _listing.full_path(line))
    return out


def _split_of(image: str, sources: _Sources) -> str | None:
    """The split of an image (full path) a data.yaml places, or None."""
    if image in sources.images:
        return sources.images[image]
    for folder, split in sources.folders:
        if image.startswith(folder.rstrip("/") + "/"):
            return split
    return None

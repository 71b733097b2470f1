"""COCO instances files (--annotations FILE.json): boxes matched to the listed images."""

from __future__ import annotations

import collections
import json
import logging
import posixpath
from collections.abc import Sequence
from typing import Any

from conversion.targets._box_files import BoxAnnotations, Index, finite, id_key, size_of, some
from conversion.targets.labels_csv import normalise_rel

__all__ = ["read_coco"]

_LOG = logging.getLogger("shardsmith.convert")


def read_coco(data: bytes, source: str, listed: Sequence[str]) -> BoxAnnotations:
    """Reads a COCO instances file and matches its images to the listed paths.

    Categories in id order become labels 0..k-1; each image's boxes come in
    annotation id order, [x, y, w, h] becoming corners (x, y, x + w, y + h).

    Args:
      data: The JSON file's bytes.
      source: --annotations, for messages.
      listed: Relative paths under --input_dir (files and problems).

    Raises:
      ValueError: When the file is not a COCO instances JSON document.
    """
    try:
        doc = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--annotations {source} is not a JSON file ({e}).") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise ValueError(f"--annotations {source} must be a COCO instances JSON object with an "
                         f"'images' list (and 'categories', 'annotations').")
    category_ids, class_names = _categories(doc, source)
    label_of = {cid: i for i, cid in enumerate(category_ids)}
    issues = collections.Counter()
    files, image_file, missing, invalid = _images(doc, source, Index(listed), issues)
    unknown_images = _boxes(doc, files, image_file, label_of, issues)
    if unknown_images:
        _LOG.warning("--annotations %s: %d annotations name image ids that are not among its images: %s",
                     source, len(unknown_images), some(unknown_images))
    return BoxAnnotations("coco", class_names, category_ids, files, tuple(sorted(missing.items())), invalid,
                          dict(issues))


def _categories(doc: dict, source: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(category ids, class names), in id order."""
    try:
        categories = sorted(doc.get("categories") or [], key=lambda c: int(c["id"]))
        category_ids = tuple(int(c["id"]) for c in categories)
        class_names = tuple(str(c.get("name", c["id"])) for c in categories)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"--annotations {source}: every category needs an integer 'id' ({e!r}).") from None
    if len(set(category_ids)) != len(category_ids):
        raise ValueError(f"--annotations {source}: category ids are not unique: {list(category_ids)}")
    return category_ids, class_names


def _images(doc: dict, source: str, index: Index, issues) -> tuple[dict, dict, dict, dict]:
    """(relative path -> its entry, image id -> relative path or None, missing name -> message,
    relative path -> why its annotations cannot be used).

    Images in id order. One file named by several ids keeps its first id's
    entry (the others' annotations are ignored); an entry repeated as it was
    counts once. An id given to several files says nothing of which file its
    annotations are on: each of those files is rejected (`invalid`), not kept
    with another file's boxes or none. A file not listed is missing.
    """
    files: dict[str, dict] = {}
    image_file: dict[Any, str | None] = {}
    missing: dict[str, str] = {}
    entries = []
    for image in doc["images"]:
        if isinstance(image, dict) and "id" in image and isinstance(image.get("file_name"), str):
            entries.append(image)
        else:
            issues["bad_image_entry"] += 1
    # Each id's files: the listed path, or the name when none is listed.
    files_of_id = collections.defaultdict(set)
    for image in entries:
        files_of_id[image["id"]].add(index.find(image["file_name"]) or normalise_rel(image["file_name"]))
    invalid = _shared_ids(files_of_id, index, source, issues)
    for image in sorted(entries, key=lambda im: id_key(im["id"])):
        rel = index.find(image["file_name"])
        if rel is None:
            name = normalise_rel(image["file_name"])
            missing.setdefault(name, _not_found(name, image["id"], index, source))
            image_file[image["id"]] = None
            continue
        if len(files_of_id[image["id"]]) > 1:
            image_file[image["id"]] = None  # Its files are rejected (`invalid`).
            continue
        if image_file.get(image["id"]) == rel:
            continue  # The same entry again: its annotations are this file's all the same.
        if rel in files or rel in invalid:
            issues["duplicate_image"] += 1
            _LOG.warning("--annotations %s: image id %s names %s again; its annotations are ignored",
                         source, image["id"], rel)
            image_file[image["id"]] = None
            continue
        image_file[image["id"]] = rel
        files[rel] = {"size": size_of(image.get("width"), image.get("height")), "ref": "annotation_id",
                      "boxes": [], "dropped": [], "regions": []}
    return files, image_file, missing, invalid


def _not_found(name: str, image_id, index: Index, source: str) -> str:
    """Why an image entry's file_name names no listed file: none has it, or several have its name."""
    where = f"named in --annotations {source} (image id {image_id})"
    same_name = index.by_name.get(posixpath.basename(name), [])
    if len(same_name) > 1:
        return (f"{where} is not a path under --input_dir, and {len(same_name)} files there have its name "
                f"({some(same_name)}): give file_name relative to --input_dir")
    return f"{where} but not found under --input_dir"


def _shared_ids(files_of_id: dict, index: Index, source: str, issues) -> dict[str, str]:
    """Listed path -> message, for every listed file of an image id that several files share."""
    invalid: dict[str, str] = {}
    for image_id in sorted(files_of_id, key=id_key):
        names = sorted(files_of_id[image_id])
        if len(names) < 2:
            continue
        issues["duplicate_image_id"] += 1
        _LOG.warning("--annotations %s: image id %s is given to %d images (%s); they are rejected",
                     source, image_id, len(names), some(names))
        for rel in names:
            if rel in index.paths:
                invalid.setdefault(rel, (
                    f"--annotations {source} gives image id {image_id} to {len(names)} images "
                    f"({some(names)}): which boxes are this image's cannot be told"))
    return invalid


def _boxes(doc: dict, files: dict, image_file: dict, label_of: dict, issues) -> list:
    """Adds each annotation, in id order, to its image's entry (a box, or dropped with its reason);
    returns the image ids named that are no image of the file."""
    unknown_images = []
    annotations = doc.get("annotations") or []
    keyed = sorted(((id_key(a.get("id") if isinstance(a, dict) else None), k, a)
                    for k, a in enumerate(annotations)), key=lambda t: (t[0], t[1]))
    for _, position, ann in keyed:
        if not isinstance(ann, dict):
            issues["bad_annotation"] += 1
            continue
        ref = ann.get("id", f"#{position}")
        if ann.get("image_id") not in image_file:
            issues["unknown_image"] += 1
            unknown_images.append(ann.get("image_id"))
            continue
        rel = image_file[ann["image_id"]]
        if rel is None:
            continue  # Its image is missing (or named twice): listed there.
        entry = files[rel]
        category = _category_id(ann.get("category_id"))
        bbox = ann.get("bbox")
        corners = finite(bbox) if isinstance(bbox, (list, tuple)) and len(bbox) == 4 else None
        if corners is None and bbox is None and category in label_of:
            # Some exporters write polygons only (the format asks for both): the box around the
            # polygons' points, counted apart.
            corners = _polygons_extent(ann.get("segmentation"))
            if corners is not None:
                issues["bbox_from_segmentation"] += 1
        if category not in label_of:
            issues["unknown_category"] += 1
            entry["dropped"].append([ref, "unknown_category"])
        elif corners is None:
            issues["bad_bbox"] += 1
            entry["dropped"].append([ref, "bad_bbox"])
        else:
            x, y, w, h = corners
            entry["boxes"].append([ref, x, y, x + w, y + h, label_of[category], _is_crowd(ann.get("iscrowd"))])
            entry["regions"].append(_region(ann.get("segmentation")))
    return unknown_images


def _region(segmentation) -> list | None:
    """The region an annotation's segmentation draws (`conversion.annotation_masks`): None (its box,
    where it has no segmentation), ['polygons', [[x0, y0, ...], ...]], ['rle', {'size', 'counts'}]
    (compressed counts text or uncompressed counts list), or ['bad', why it cannot be drawn]."""
    if segmentation is None or segmentation == []:
        return None
    if isinstance(segmentation, list):
        polygons = []
        for polygon in segmentation:
            values = finite(polygon) if isinstance(polygon, list) and len(polygon) >= 6 \
                and len(polygon) % 2 == 0 else None
            if values is None:
                return ["bad", "its segmentation polygon is not [x0, y0, x1, y1, x2, y2, ...] of finite numbers "
                               "(three points or more)"]
            polygons.append(values)
        return ["polygons", polygons]
    if not isinstance(segmentation, dict):
        return ["bad", f"its segmentation is a {type(segmentation).__name__}, not polygons or an RLE"]
    size, counts = segmentation.get("size"), segmentation.get("counts")
    if not (isinstance(size, list) and len(size) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)):
        return ["bad", f"its RLE's size {size!r} is not [height, width] of whole numbers above 0"]
    if isinstance(counts, str) and counts.isascii():
        return ["rle", {"size": size, "counts": counts}]
    if isinstance(counts, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
        if sum(counts) != size[0] * size[1]:
            return ["bad", f"its RLE's counts sum to {sum(counts)}, its size {size[1]}x{size[0]} has "
                           f"{size[0] * size[1]} pixels"]
        return ["rle", {"size": size, "counts": counts}]
    return ["bad", "its RLE's counts are neither a compressed text nor a list of whole numbers"]


def _polygons_extent(segmentation) -> list[float] | None:
    """[x, y, width, height] around a polygon segmentation ([[x0, y0, x1, y1, ...], ...]), or None.

    None for RLE (a dict: crowd regions, which COCO writers always box) and
    for anything not a list of finite coordinate pairs.
    """
    if not isinstance(segmentation, list) or not segmentation:
        return None
    points = []
    for polygon in segmentation:
        values = finite(polygon) if isinstance(polygon, list) and len(polygon) >= 6 and len(polygon) % 2 == 0 \
            else None
        if values is None:
            return None
        points.extend(zip(values[0::2], values[1::2]))
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]


def _category_id(value):
    """An annotation's category_id as `_categories` reads the categories' ids: "3" and 3.0 are 3."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    return int(number) if number.is_integer() else value


def _is_crowd(value) -> int:
    """COCO's iscrowd as 0 or 1; written as a number, a bool or text ("0" is no crowd)."""
    if isinstance(value, str):
        return 1 if value.strip().lower() in ("1", "true") else 0
    return 1 if value else 0

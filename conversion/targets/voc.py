"""Pascal VOC XML files (--annotations FOLDER): boxes matched to the images of their stems."""

from __future__ import annotations

import collections
import logging
import posixpath
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence

from conversion.targets._box_files import BoxAnnotations, Index, finite, size_of, some

__all__ = ["read_voc"]

_LOG = logging.getLogger("shardsmith.convert")


def read_voc(documents: Sequence[tuple[str, bytes | OSError]], source: str, listed: Sequence[str]) -> BoxAnnotations:
    """Reads Pascal VOC XML files and matches each to the listed image of its own stem.

    The `<filename>` tag is not used to find the image (real files disagree
    with their names); it only breaks a tie between several images of the
    stem. `<bndbox>` corners are 1-based: the min corner becomes
    (xmin - 1, ymin - 1), the max corner stays (as detectron2 reads VOC).
    Labels are the sorted object names; `<difficult>` is the box's is_crowd.

    Args:
      documents: (XML file's name relative to --annotations, its bytes or the
        OSError of its read: its image's 'bad_target'), sorted.
      source: --annotations, for messages.
      listed: Relative paths under --input_dir (files and problems).
    """
    index = Index(listed)
    issues = collections.Counter()
    parsed: dict[str, dict] = {}  # rel_path -> {"size", "objects": [(ref, name, box or None, difficult)]}
    missing: dict[str, str] = {}
    invalid: dict[str, str] = {}
    # Of every readable XML file, its image found or not: the classes do not depend on the images.
    names: set[str] = set()
    for name, data in documents:
        stem = posixpath.splitext(posixpath.basename(name))[0]
        root, error = _parse(data, f"annotation {name} in --annotations {source}")
        tag_name = (root.findtext("filename") or "").strip() if root is not None else ""
        objects = [] if root is None else _voc_objects(root)
        names.update(label for _, label, corners, _ in objects if label and corners is not None)
        rel = _voc_image(index, stem, tag_name, name, source, issues)
        if rel is None:
            if not index.by_stem.get(stem):
                missing.setdefault(stem, f"annotation {name} in --annotations {source} names image "
                                         f"{stem!r} (its file's stem), which is not under --input_dir")
            continue
        if rel in parsed or rel in invalid:
            issues["duplicate_image"] += 1
            _LOG.warning("--annotations %s: %s annotates %s again; ignored", source, name, rel)
            continue
        if root is None:
            invalid[rel] = error
            continue
        size = root.find("size")
        parsed[rel] = {"size": None if size is None else size_of(size.findtext("width"), size.findtext("height")),
                       "objects": objects}
    class_names = tuple(sorted(names))
    label_of = {name: i for i, name in enumerate(class_names)}
    files = {}
    for rel, entry in parsed.items():
        boxes, dropped = [], []
        for ref, label, corners, difficult in entry["objects"]:
            if not label:
                issues["no_name"] += 1
                dropped.append([ref, "no_name"])
            elif corners is None:
                issues["bad_bbox"] += 1
                dropped.append([ref, "bad_bbox"])
            else:
                xmin, ymin, xmax, ymax = corners
                boxes.append([ref, xmin - 1.0, ymin - 1.0, xmax, ymax, label_of[label], difficult])
        files[rel] = {"size": entry["size"], "ref": "object", "boxes": boxes, "dropped": dropped}
    return BoxAnnotations("voc", class_names, None, files, tuple(sorted(missing.items())), invalid,
                          dict(issues))


def _parse(data: bytes | OSError, what: str):
    """(the <annotation> element with its tags' namespaces dropped, None), or (None, why not).

    Tools that declare a default namespace write `{uri}object` tags, which a
    plain `findall("object")` would skip: the boxes would be lost unsaid.
    """
    if isinstance(data, OSError):
        return None, f"{what} cannot be read ({data.strerror or data})"
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as e:
        return None, f"{what} is not valid XML ({e})"
    for element in root.iter():
        if isinstance(element.tag, str) and element.tag.startswith("{"):
            element.tag = element.tag.split("}", 1)[1]
    if root.tag != "annotation":
        return None, (f"{what} is not a Pascal VOC annotation: its root element is <{root.tag}>, "
                      "not <annotation>")
    return root, None


def _voc_objects(root) -> list[tuple]:
    """(position from 1, name, [xmin, ymin, xmax, ymax] or None, difficult) of each <object>, in order.

    Only the annotation's own <object> elements: a <part> inside one (VOC's
    person layout) is not a box of the image.
    """
    objects = []
    for k, obj in enumerate(root.findall("object"), start=1):
        label = (obj.findtext("name") or "").strip()
        box = obj.find("bndbox")
        corners = None if box is None else finite(box.findtext(t) for t in ("xmin", "ymin", "xmax", "ymax"))
        try:
            difficult = 1 if float(obj.findtext("difficult") or 0) else 0
        except ValueError:
            difficult = 0
        objects.append((k, label, corners, difficult))
    return objects


def _voc_image(index: Index, stem: str, tag_name: str, name: str, source: str, issues) -> str | None:
    """The listed image of a VOC XML file's stem; None when there is none or the stem is ambiguous."""
    found = index.by_stem.get(stem, [])
    if len(found) > 1:
        by_tag = [p for p in found if posixpath.basename(p) == posixpath.basename(tag_name)]
        if len(by_tag) != 1:
            issues["ambiguous_image"] += 1
            _LOG.warning("--annotations %s: %s could annotate any of %s (the same stem); ignored. "
                         "Point --input_dir at the images' folder.", source, name, some(found))
            return None
        found = by_tag
    return found[0] if found else None

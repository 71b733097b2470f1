"""Reading a folder of per-image annotation files while planning: on threads against one by one.

`--annotations FOLDER` of Pascal VOC XML files or YOLO label files is listed,
read and parsed before the first shard is written. The threaded read
(`conversion.files.read_many`, what the readers use) is timed against the
baseline of the same reader with its files read one after another (what it
did before), in the same process, rounds interleaved: listing + reading +
parsing, best of `--repeat` rounds each, and their ratio.

`--folder` times an existing folder (a gs:// one too, e.g. on
gcp-storage-emulator with STORAGE_EMULATOR_HOST set) of that format whose
images are the files' stems as .jpg; else `--count` files are written to a
temporary folder.

Usage:

  python -m bench.annotation_reads [--format voc|yolo] [--count 20000] [--repeat 3] [--folder PATH]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from unittest import mock

from conversion import files, listing
from conversion.targets import boxes, voc, yolo

_LOG = logging.getLogger("bench.annotation_reads")


def write_folder(folder: str, form: str, count: int) -> None:
    """`count` small annotation files of `form` ('voc' or 'yolo') in `folder`, image i's stem f{i:06d}."""
    os.makedirs(folder, exist_ok=True)
    for i in range(count):
        stem = f"f{i:06d}"
        if form == "voc":
            body = (f"<annotation><filename>{stem}.jpg</filename><size><width>64</width><height>48</height>"
                    f"</size><object><name>c{i % 5}</name><difficult>0</difficult><bndbox><xmin>{1 + i % 9}"
                    "</xmin><ymin>2</ymin><xmax>30</xmax><ymax>40</ymax></bndbox></object></annotation>")
            name = stem + ".xml"
        else:
            body = f"{i % 5} 0.5 0.5 0.25 0.5\n{(i + 1) % 5} 0.4 0.3 0.2 0.2\n"
            name = stem + ".txt"
        with open(os.path.join(folder, name), "w") as f:
            f.write(body)


def plan_reads(folder: str, form: str) -> int:
    """Lists `folder`, reads and parses its annotations as planning does; the number of images with boxes."""
    found, _ = listing.list_input(folder)
    images = sorted(os.path.splitext(f.rel_path)[0] + ".jpg" for f in found)
    if form == "voc":
        xmls = [f for f in found if f.rel_path.endswith(".xml")]
        return len(voc.read_voc(boxes._documents(xmls), folder, images).files)
    read, _ = yolo.read_yolo(folder, folder + "_images", images, class_names=tuple(f"c{k}" for k in range(5)),
                             found=found)
    return len(read.files)


def _one_by_one(paths):
    """The baseline: each file read after the one before (errors raise, as they did)."""
    return [files.read_bytes(p) for p in paths]


def measure(folder: str, form: str, repeat: int) -> dict:
    """Best seconds of each way over `repeat` interleaved rounds."""
    best = {"one by one": float("inf"), "threads": float("inf")}
    counts = set()
    for _ in range(repeat):
        for name in best:
            patches = ([mock.patch.object(boxes, "read_many", _one_by_one), mock.patch.object(yolo, "read_many", _one_by_one)]
                       if name == "one by one" else [])
            for p in patches:
                p.start()
            try:
                start = time.perf_counter()
                counts.add(plan_reads(folder, form))
                best[name] = min(best[name], time.perf_counter() - start)
            finally:
                for p in patches:
                    p.stop()
    assert len(counts) == 1, counts  # Both ways find the same boxes.
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("voc", "yolo"), default="voc")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder
        if folder is None:
            folder = os.path.join(tmp, args.format)
            write_folder(folder, args.format, args.count)
        best = measure(folder, args.format, args.repeat)
    base, new = best["one by one"], best["threads"]
    _LOG.info("%s %s: one by one %.3f s, threads %.3f s (%.2fx the baseline's time)", args.format, folder,
              base, new, new / base)


if __name__ == "__main__":
    main()

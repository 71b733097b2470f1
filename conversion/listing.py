"""Listing the input folder: every file found, in a stable order.

Local folders are walked with `os.scandir` so that symbolic links, loops and
hidden files are seen and reported; other file systems (gs://, ...) are listed
through Beam's FileSystems (imported only then). Either way the result is sorted, so the same folder
always gives the same listing.
"""

from __future__ import annotations

import dataclasses
import errno
import heapq
import os
import stat

from conversion.files import scheme

__all__ = ["InputFile", "Problem", "list_input", "is_local", "full_path", "display_path"]

# Files that operating systems and tools drop into image folders.
_SYSTEM_FILES = frozenset({"thumbs.db", "desktop.ini", "ehthumbs.db", "icon\r"})

# The files GDAL, QGIS and ArcGIS keep beside a raster, named after it: part of that
# raster, never an image of their own. Suffix of the raster's whole name -> what it is.
# (An external overview or mask is itself a TIFF, and would otherwise be converted as one
# more image: a reduced copy of the scene's pixels under its class.)
_SIDECARS = {
    ".aux.xml": ("GDAL's metadata sidecar", "; read with the raster as GDAL reads it: its nodata value "
                 "and georeferencing win over the raster's tags (its statistics are not read)"),
    ".ovr": ("GDAL's external overviews", ": reduced copies of its pixels"),
    ".msk": ("GDAL's external mask", "; read with the raster as its mask where it has no internal one "
             "(as GDAL reads it)"),
    ".xml": ("ArcGIS's metadata sidecar", ""),
}
# Beside a raster's stem (`scene.tfw` for `scene.tif`): world files and pyramids.
_STEM_SIDECARS = {
    ".wld": ("a world file", "; read with --raster_georef as the raster's georeferencing where its "
             "tags give none (as GDAL reads it)"),
    ".prj": ("an ESRI projection file", "; read with --raster_georef as the raster's CRS where "
             "nothing else gives one"),
    ".rrd": ("ERDAS/ArcGIS pyramids", ": reduced copies of its pixels"),
}


@dataclasses.dataclass(frozen=True)
class InputFile:
    """A regular file found under the input root.

    Attributes:
      rel_path: Path relative to the root, POSIX separators.
      path: Full path or URL to open it with.
      size: Size in bytes.
      mtime_ns: Its modification time in nanoseconds, as listed (0: not known, a URL's).
    """

    rel_path: str
    path: str
    size: int
    mtime_ns: int = dataclasses.field(default=0, compare=False)


@dataclasses.dataclass(frozen=True)
class Problem:
    """An input that will not be converted, and why.

    Attributes:
      rel_path: Path relative to the input root.
      reason: A key of `schemas.REJECT_REASONS` or `schemas.SKIP_REASONS`.
      message: A sentence for humans.
    """

    rel_path: str
    reason: str
    message: str


def is_local(path: str) -> bool:
    return scheme(path) in (None, "file")


def full_path(path: str) -> str:
    """A path as compared with another: absolute where local (POSIX separators), a URL without its trailing '/'."""
    if is_local(path):
        return os.path.abspath(path).replace(os.sep, "/")
    return path.rstrip("/")


def display_path(rel_path: str) -> str:
    """A printable form of a path that may hold bytes that are not UTF-8."""
    return os.fsencode(rel_path).decode("utf-8", "backslashreplace")


def is_hidden(name: str) -> bool:
    """Hidden and system files: '.DS_Store', '._photo.jpg', 'Thumbs.db', ..."""
    return name.startswith(".") or name.lower() in _SYSTEM_FILES


def list_input(root: str) -> tuple[list[InputFile], list[Problem]]:
    """Lists every file under `root`.

    Args:
      root: A local folder or a file system URL.

    Returns:
      (files, problems), both sorted by relative path. Hidden files, broken
      links and link loops are problems, so that nothing found goes unreported;
      so are the GIS sidecars of a listed file (`scene.tif.aux.xml`,
      `scene.tif.ovr`, `scene.tif.msk`, `scene.tfw`, ...), skipped as 'sidecar'.

    Raises:
      FileNotFoundError: If the root does not exist or is not a folder.
    """
    if is_local(root):
        files, problems = _walk_local(root)
    else:
        files, problems = _list_remote(root)
    files, sidecars = _without_sidecars(files)
    problems += sidecars
    files.sort(key=lambda f: os.fsencode(f.rel_path))
    problems.sort(key=lambda p: os.fsencode(p.rel_path))
    return files, problems


def _sidecar_of(rel_path: str, names: frozenset[str],
                by_stem: dict[str, list[str]]) -> tuple[str, tuple[str, str]] | None:
    """(the file it belongs to, (what it is, a note)) when `rel_path` is a GIS sidecar of a listed file.

    `scene.tif.aux.xml`, `scene.tif.ovr`, `scene.tif.msk` and `scene.tif.xml` belong to
    `scene.tif`; world files (`scene.tfw`, `scene.tifw`, `scene.wld`), `scene.prj` and
    `scene.rrd` to the file of that stem. Only when that file is listed too (`names`;
    `by_stem`: the listed names by their path less the last extension).
    """
    lower = rel_path.lower()
    for suffix, what in _SIDECARS.items():
        if lower.endswith(suffix) and rel_path[:-len(suffix)] in names:
            return rel_path[:-len(suffix)], what
    stem, dot, ext = rel_path.rpartition(".")
    ext = ext.lower()
    if not dot or "/" in ext or not (ext.endswith("w") or "." + ext in _STEM_SIDECARS):
        return None
    siblings = [n for n in by_stem.get(stem, ()) if n != rel_path]
    for sibling in siblings:
        own = sibling[len(stem) + 1:].lower()
        if own and ext in (own[0] + own[-1] + "w", own + "w"):  # GDAL's world file names.
            return sibling, _STEM_SIDECARS[".wld"]
    if "." + ext in _STEM_SIDECARS and siblings:
        # Named after the raster, not after its world file or another sidecar of it.
        rasters = [n for n in siblings if not n.lower().endswith((*_STEM_SIDECARS, "w"))]
        return (rasters or siblings)[0], _STEM_SIDECARS["." + ext]
    return None


def _without_sidecars(files: list[InputFile]) -> tuple[list[InputFile], list[Problem]]:
    """The files less GIS sidecars of other listed files, and those sidecars as skipped problems."""
    names = frozenset(f.rel_path for f in files)
    by_stem: dict[str, list[str]] = {}
    for name in sorted(names, key=os.fsencode):
        stem, dot, ext = name.rpartition(".")
        if dot and "/" not in ext:
            by_stem.setdefault(stem, []).append(name)
    kept, skipped = [], []
    for f in files:
        found = _sidecar_of(f.rel_path, names, by_stem)
        if found is None:
            kept.append(f)
        else:
            owner, (what, note) = found
            skipped.append(Problem(f.rel_path, "sidecar", f"{what} of {display_path(owner)}{note}"))
    return kept, skipped


def _walk_local(root: str):
    root = os.path.abspath(root.removeprefix("file://"))
    if not os.path.isdir(root):
        raise FileNotFoundError(f"--input_dir {root!r} does not exist or is not a folder.")
    files: list[InputFile] = []
    problems: list[Problem] = []
    # Real path of each folder listed -> where it was listed. Real folders are
    # walked first, links to folders after them (in name order): a link never
    # takes a folder's files away from the folder itself (a class folder's
    # images listed, and labelled, under the class of a folder linking to it).
    listed = {os.path.realpath(root): ""}
    links: list[tuple[bytes, str, str, frozenset]] = []

    def walk(folder: str, rel: str, above: frozenset):
        with os.scandir(folder) as it:
            entries = list(it)
        # Files and problems in any order (both are sorted at the end); only
        # folders are walked in name order, as which of two links to one
        # folder is listed depends on that order.
        folders = []
        for entry in entries:
            rel_path = f"{rel}{entry.name}"
            if is_hidden(entry.name):
                problems.append(Problem(rel_path, "hidden_file", "hidden or system file"))
                continue
            try:
                st = os.stat(entry.path)  # Follows links.
            except OSError as e:
                if e.errno == errno.ELOOP:
                    problems.append(Problem(rel_path, "symlink_loop", f"link loop: {e.strerror}"))
                elif entry.is_symlink():
                    problems.append(Problem(
                        rel_path, "broken_symlink",
                        f"link to missing {os.readlink(entry.path)!r}",
                    ))
                else:
                    problems.append(Problem(rel_path, "unreadable", f"cannot stat: {e.strerror}"))
                continue
            if stat.S_ISDIR(st.st_mode):
                item = (os.fsencode(rel_path), rel_path, entry.path, above)
                if entry.is_symlink():
                    heapq.heappush(links, item)
                else:
                    folders.append(item)
            elif stat.S_ISREG(st.st_mode):
                files.append(InputFile(rel_path, entry.path, st.st_size, st.st_mtime_ns))
            else:
                problems.append(Problem(rel_path, "unreadable", "not a regular file"))
        for item in sorted(folders):
            enter(*item[1:])

    def enter(rel_path: str, path: str, above: frozenset):
        real = os.path.realpath(path)
        if real in above:
            problems.append(Problem(rel_path, "symlink_loop", "link to a folder above it (a cycle)"))
            return
        if real in listed:
            where = display_path(listed[real]) or "the input folder"
            problems.append(Problem(
                rel_path, "symlink_loop", f"link to a folder already listed, as {where!r}"
            ))
            return
        listed[real] = rel_path
        try:
            walk(path, rel_path + "/", above | {real})
        except PermissionError as e:
            problems.append(Problem(rel_path, "unreadable", f"cannot list: {e.strerror}"))

    walk(root, "", frozenset([os.path.realpath(root)]))
    while links:
        enter(*heapq.heappop(links)[1:])
    return files, problems


def _list_remote(root: str):
    root = root.rstrip("/")
    # Object stores (gs://, s3://) have no folders: the root is a prefix of
    # object names, and a class tree has no object directly under it.
    from apache_beam.io.filesystems import FileSystems

    found = FileSystems.match([root + "/**"])[0].metadata_list
    if not found:
        raise FileNotFoundError(f"--input_dir {root!r} does not exist or is empty.")
    files: list[InputFile] = []
    problems: list[Problem] = []
    for meta in found:
        rel_path = meta.path[len(root) + 1:]
        if not rel_path or rel_path.endswith("/"):
            continue  # Folder placeholder objects.
        if any(is_hidden(part) for part in rel_path.split("/")):
            problems.append(Problem(rel_path, "hidden_file", "hidden or system file"))
        else:
            files.append(InputFile(rel_path, meta.path, meta.size_in_bytes))
    return files, problems

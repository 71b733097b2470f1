"""What both scene readers (`imaging.patches.SceneReader`, `imaging.jp2.Jp2SceneReader`) do alike
with a window: check its arguments, mark its pixels past the scene, and fill them.

Below both readers, so that neither imports the other (`imaging.patches.open_scene` picks one).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["check_window", "outside", "padding_fill", "plane_fill"]


def check_window(reader: str, y, x, height, width) -> None:
    """Raises ValueError, naming `reader`, unless y, x, height and width are integers and the window is 1x1 or more."""
    for what, value in (("y", y), ("x", x), ("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{reader}: {what} must be an integer. Received: {value!r}")
    if height < 1 or width < 1:
        raise ValueError(f"{reader}: a window must be at least 1x1 pixels. Received: {height}x{width}")


def outside(y: int, x: int, height: int, width: int, scene_height: int, scene_width: int) -> np.ndarray:
    """(height, width) booleans: True where the window at (y, x) lies outside a scene of that size."""
    rows = np.arange(y, y + height)
    columns = np.arange(x, x + width)
    inside_rows = (rows >= 0) & (rows < scene_height)
    inside_columns = (columns >= 0) & (columns < scene_width)
    return ~(inside_rows[:, np.newaxis] & inside_columns[np.newaxis, :])


def padding_fill(nodata, dtype):
    """What pixels past a scene's edge (outside its grid) hold: its nodata value, or 0 without one or when
    `dtype` (a numpy dtype) cannot hold it; per band (a tuple) where the nodata is per band (`imaging.nodata`)."""
    if isinstance(nodata, tuple):
        return tuple(padding_fill(v, dtype) for v in nodata)
    fits = nodata is not None and (dtype.kind == "f" or (
        math.isfinite(nodata) and nodata == int(nodata) and np.iinfo(dtype).min <= nodata <= np.iinfo(dtype).max))
    return nodata if fits else 0


def plane_fill(fill, plane: int):
    """The fill (`padding_fill`) of one band, 0-based."""
    return fill[plane] if isinstance(fill, tuple) else fill

"""How a kind of target is drawn on `shardsmith preview`'s tiles: the `Overlay` a row of
`readers.targets.MODES` gives (`TargetMode.overlay`), and what every overlay shares.

An overlay reads its kind's target from a decoded record (`read`), colours
the tile's pixels with it (`paint`: a mask), draws on the tile (`draw`:
boxes, with PIL's `ImageDraw` and font that preview passes in), and says
what its colours mean (`legend`) and what it could not show (`notes`).
Each works in the tile's `Frame`: where the tile's pixels lie in the stored
image, through the reader's resize. Nothing here imports an imaging library.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Overlay", "Frame", "PALETTE", "MASK_ALPHA", "INK", "colour_of", "fit", "line_height"]

# One colour per mask class id or box class (cycled): 20 distinct colours (Sasha
# Trubetskoy's list). A mask colour covers this fraction of the pixel.
PALETTE = (
    (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
    (145, 30, 180), (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212),
    (0, 128, 128), (220, 190, 255), (170, 110, 40), (255, 250, 200), (128, 0, 0),
    (170, 255, 195), (128, 128, 0), (255, 215, 180), (0, 0, 128), (128, 128, 128),
)
MASK_ALPHA = 0.45
# The colour of text on the sheet.
INK = (25, 25, 25)
# Legend entries of one overlay at most.
MAX_LEGEND = 40


def colour_of(index: int) -> tuple[int, int, int]:
    """The overlay colour of mask class id or box class `index`."""
    return PALETTE[index % len(PALETTE)]


@dataclasses.dataclass(frozen=True)
class Frame:
    """Where a square tile's pixels lie in its record's stored image.

    Attributes:
      height, width: The stored image's size.
      size: The tile's side.
      top, left, win_h, win_w: The window of the stored image (in its
        pixels) that the reader fit to the tile (negative offsets: padding).
    """

    height: int
    width: int
    size: int
    top: float
    left: float
    win_h: float
    win_w: float

    def x(self, fraction: float) -> float:
        """The tile x of a fraction of the stored image's width."""
        return (fraction * self.width - self.left) * self.size / self.win_w

    def y(self, fraction: float) -> float:
        """The tile y of a fraction of the stored image's height."""
        return (fraction * self.height - self.top) * self.size / self.win_h

    def centres(self) -> tuple[np.ndarray, np.ndarray]:
        """(ys, xs): each tile row's and column's centre as a fraction of the stored image
        (outside [0, 1): padding)."""
        centres = (np.arange(self.size) + 0.5) / self.size
        return (self.top + centres * self.win_h) / self.height, (self.left + centres * self.win_w) / self.width


class Overlay:
    """How one kind of target is drawn on the tiles; each method's default draws nothing."""

    def read(self, values: dict):
        """This kind's target of one record (`values`: the schema's `decode`), or None."""
        return None

    def paint(self, pixels: np.ndarray, target, frame: Frame) -> np.ndarray:
        """The tile's uint8 RGB pixels with `target` coloured in."""
        return pixels

    def draw(self, draw, target, frame: Frame, font) -> None:
        """Draws `target` on the tile (`draw`: PIL's `ImageDraw` of the tile)."""

    def legend(self, shown: list) -> list[tuple[tuple[int, int, int] | None, str]]:
        """(colour or None, text) entries for the targets on the tiles (`shown`: `read`'s, None
        for a tile without)."""
        return []

    def notes(self) -> list[str]:
        """Warnings for the sheet's footer (targets that could not be shown)."""
        return []


def line_height(font) -> int:
    """The pixels a line of `font` takes."""
    ascent, descent = font.getmetrics()
    return ascent + descent + 2


def fit(font, text: str, width: float, *, path: bool = False) -> str:
    """`text`, shortened with '…' until it fits `width` pixels.

    Prose loses its end. For a `path` the end (the file's own name) is the
    most telling part: it is kept whole if it fits, and the folders are
    shortened first ('astro…/astronaut_07.jpg').
    """
    if font.getlength(text) <= width:
        return text
    shorten = _elide if path else (lambda t, keep: t[:keep].rstrip() + "…")
    lo, hi = 0, len(text) - 1  # Characters kept: the largest count that fits.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if font.getlength(shorten(text, mid)) <= width:
            lo = mid
        else:
            hi = mid - 1
    return shorten(text, lo)


def _elide(text: str, keep: int) -> str:
    """`keep` characters of `text` around a '…': the end first, up to the base name."""
    base = len(text) - text.rfind("/")  # The base name with its '/', or the whole text + 1.
    tail = min(keep, base)
    head = keep - tail
    if head < 3:  # A stub of a folder name helps nobody.
        head = 0
    return text[:head] + "…" + text[len(text) - tail:] if tail else text[:head] + "…"

"""Where a `shuffle="global"` read stands, to resume it exactly.

The global order of a split is a sequence of positions: position `p` of epoch
`e` is record `permutation(seed, e)[p]`, one permutation of every record per
epoch. A read is at `ReadPosition(epoch, consumed)`: the first `consumed`
positions of `epoch` are done. Reading again from it with the same `seed`
(and split) yields exactly what the interrupted run would have yielded next,
in the same order, with the same augmentation, whatever the number of input
pipelines or replicas.

Batches are cut from positions, not from records delivered: a batch of size G
covers G positions, so it is one record short for each damaged record skipped
in it (`max_bad_records`), and the position after b batches is still b * G
past the start. Without `repeat` the last batch of an epoch may be partial;
the next position is then the start of the next epoch.

    tracker = readers.PositionTracker(records_per_epoch=ds.records_per_epoch)
    checkpoint = tf.train.Checkpoint(model=model, position=tracker)
    ...  # tracker.advance(global_batch_size) after each step, or ResumeCallback
    checkpoint.restore(path)
    ds = readers.image_dataset_from_tfrecords(..., shuffle="global", seed=seed,
                                              start=tracker.position())
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

__all__ = ["ReadPosition", "PositionTracker"]


def _check_count(name: str, value, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive" if minimum > 0 else "a non-negative"
        raise ValueError(f"`{name}` must be {kind} integer. Received: {name}={value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class ReadPosition:
    """A position in the global order: `consumed` positions into `epoch`.

    Attributes:
      epoch: The epoch (0-based); each has its own permutation.
      consumed: Positions of `epoch` already read, i.e. records delivered plus
        damaged records skipped. May exceed an epoch; it is then carried into
        later epochs when reading (see `normalized`).
    """

    epoch: int = 0
    consumed: int = 0

    def __post_init__(self):
        _check_count("epoch", self.epoch)
        _check_count("consumed", self.consumed)

    def normalized(self, records_per_epoch: int) -> ReadPosition:
        """The same position with `consumed` < `records_per_epoch`."""
        n = _check_count("records_per_epoch", records_per_epoch, 1)
        return ReadPosition(self.epoch + self.consumed // n, self.consumed % n)

    def advance(
        self, num_records: int, *, records_per_epoch: int, repeat: bool = True
    ) -> ReadPosition:
        """The position `num_records` positions later.

        Args:
          num_records: Positions read since this one, e.g. steps times the
            global batch size.
          records_per_epoch: Records of the split (`dataset.records_per_epoch`).
          repeat: As the dataset's `repeat`. With True batches run on into the
            next epoch; with False the dataset ends with the epoch, so the
            position after its last (possibly partial) batch is the start of
            the next epoch.

        Returns:
          The new `ReadPosition`, normalized.
        """
        n = _check_count("records_per_epoch", records_per_epoch, 1)
        _check_count("num_records", num_records)
        here = self.normalized(n)
        total = here.consumed + num_records
        if not repeat:
            total = min(total, n)
        return ReadPosition(here.epoch, total).normalized(n)

    def to_dict(self) -> dict[str, int]:
        """A JSON-serializable dict, e.g. to store beside a checkpoint."""
        return {"epoch": self.epoch, "consumed": self.consumed}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReadPosition:
        """The inverse of `to_dict`; raises ValueError on other keys or values."""
        if not isinstance(d, Mapping) or set(d) != {"epoch", "consumed"}:
            raise ValueError(
                "A ReadPosition dict must have exactly the keys ['consumed', 'epoch']. "
                f"Received: {d!r}"
            )
        return cls(epoch=d["epoch"], consumed=d["consumed"])


class PositionTracker(tf.Module):
    """The read position as variables, saved and restored by `tf.train.Checkpoint`.

    Advance it by the global batch size after every training step (in a
    custom loop, or with `readers.ResumeCallback` in `model.fit`), checkpoint
    it with the model, and after a restore build the dataset with
    `start=tracker.position()`.

    Args:
      records_per_epoch: Records of the split (`dataset.records_per_epoch`).
      repeat: As the dataset's `repeat`, see `ReadPosition.advance`.
      start: The position the dataset starts at (default: the beginning).
      name: Module name.
    """

    def __init__(
        self,
        records_per_epoch: int,
        *,
        repeat: bool = True,
        start: ReadPosition | None = None,
        name: str | None = "position_tracker",
    ):
        super().__init__(name=name)
        self.records_per_epoch = _check_count("records_per_epoch", records_per_epoch, 1)
        if not isinstance(repeat, bool):
            raise TypeError(f"`repeat` must be True or False. Received: repeat={repeat!r}")
        self.repeat = repeat
        start = (start or ReadPosition()).normalized(self.records_per_epoch)
        with self.name_scope:
            self.epoch = tf.Variable(start.epoch, dtype=tf.int64, trainable=False, name="epoch")
            self.consumed = tf.Variable(
                start.consumed, dtype=tf.int64, trainable=False, name="consumed"
            )

    def advance(self, num_records) -> None:
        """Moves on by `num_records` positions; works eagerly and in `tf.function`."""
        n = tf.constant(self.records_per_epoch, tf.int64)
        total = self.consumed + tf.cast(num_records, tf.int64)
        if not self.repeat:
            total = tf.minimum(total, n)
        self.epoch.assign_add(total // n)
        self.consumed.assign(total % n)

    def end_epoch(self) -> None:
        """Without `repeat`: the epoch's iteration ended (a dropped partial
        batch included); moves to the start of the next epoch."""
        if self.repeat:
            return
        self.epoch.assign_add(tf.cast(self.consumed > 0, tf.int64))
        self.consumed.assign(0)

    def position(self) -> ReadPosition:
        """The current position (eager)."""
        return ReadPosition(int(self.epoch.numpy()), int(self.consumed.numpy()))

    def assign(self, position: ReadPosition) -> None:
        """Sets the position, e.g. from a `ReadPosition.from_dict`."""
        position = position.normalized(self.records_per_epoch)
        self.epoch.assign(position.epoch)
        self.consumed.assign(position.consumed)

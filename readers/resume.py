"""`ResumeCallback`: keeps a `PositionTracker` in step with `model.fit`.

Kept apart from `readers.positions` because it imports Keras, which readers
that do not train need not load.
"""

from __future__ import annotations

import logging

import keras

from readers.positions import PositionTracker

__all__ = ["ResumeCallback"]

logger = logging.getLogger(__name__)


class ResumeCallback(keras.callbacks.Callback):
    """Advances a `PositionTracker` by the global batch size after every step.

    Checkpoint the tracker with the model (e.g. `tf.train.Checkpoint(
    model=model, position=tracker)` saved from another callback, or
    `keras.callbacks.BackupAndRestore` for the model and a JSON of
    `tracker.position().to_dict()`); after a restart, pass
    `start=tracker.position()` to the reader.

    Steps run several at a time (`steps_per_execution`) are counted from the
    step numbers Keras reports. Without `repeat`, every Keras epoch reads one
    epoch of records and the tracker moves to the next epoch at its end; note
    that such a dataset reads the same epoch (the start's) each time it is
    iterated, so train several epochs with `repeat=True` and
    `steps_per_epoch` instead (a warning says so).

    Args:
      tracker: The `PositionTracker` of the dataset being trained on.
      global_batch_size: Records per step over all replicas.
    """

    def __init__(self, tracker: PositionTracker, global_batch_size: int):
        super().__init__()
        if not isinstance(tracker, PositionTracker):
            raise TypeError(
                "`tracker` must be a readers.PositionTracker. "
                f"Received: tracker={tracker!r}"
            )
        if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or (
            global_batch_size < 1
        ):
            raise ValueError(
                "`global_batch_size` must be a positive integer. "
                f"Received: global_batch_size={global_batch_size!r}"
            )
        self.tracker = tracker
        self.global_batch_size = global_batch_size
        self._last_step = -1
        self._epochs_begun = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._last_step = -1
        self._epochs_begun += 1
        if self._epochs_begun == 2 and not self.tracker.repeat:
            logger.warning(
                "A dataset read with shuffle='global' and repeat=False reads the same "
                "epoch each time it is iterated. For several epochs pass repeat=True "
                "and steps_per_epoch to fit (and the tracker repeat=True)."
            )

    def on_train_batch_end(self, batch, logs=None):
        # With steps_per_execution > 1, Keras reports only the last step of
        # each execution.
        steps = batch - self._last_step
        self._last_step = batch
        if steps > 0:
            self.tracker.advance(steps * self.global_batch_size)

    def on_epoch_end(self, epoch, logs=None):
        self.tracker.end_epoch()

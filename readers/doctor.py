"""Where each training step waits: the input pipeline or the model (`diagnose`).

The method of DS-Analyzer (Mohan et al., "Analyzing and Mitigating Data Stalls
in DNN Training", the CoorDL paper): time the same training step fed five
ways, and the reader alone, stage by stage:

1. ceiling: a few real batches kept on the device, fed in turn: the
   model's own step rate, no input cost at all;
2. cached: a few decoded batches held in memory, fed through tf.data: the
   ceiling plus the hand-off and the copy to the device;
3. warm: the reader, its records already in the page cache: adds the prep
   stall (parse, decode, resize, augment);
4. cold: the reader after the split's shard files were dropped from the page
   cache (`posix_fadvise(POSIX_FADV_DONTNEED)`, Linux, local files): adds the
   fetch stall (storage);
5. the reader alone (no model), and its stages alone: records read only;
   + parse, decode and resize; + augmentation. The stage that adds the most
   time per image is the one that bounds the input.

The share of each step spent waiting for input is 1 - rate / ceiling rate.
A run is called input-bound when that share reaches `INPUT_BOUND_SHARE` and
its steps did wait for their batches: the time blocked in the reader's `next`,
measured within the same run, is at least half of that. Without the second
condition a reader that takes CPU cores from the model (no accelerator), or
a load on a shared machine that changed between two runs, would read as a
stall. What `next` costs when a batch is already there (the iterator's own
hand-off, measured on the cached batches, 1-2 ms per call on a CPU) is not
waiting, and is taken off first: for a model of 25 steps/s it alone would
read as 4% blocked.

    report = readers.diagnose("dataset", "train", "model.keras",
                              readers.DoctorOptions(batch_size=64))
    print(report.text)

On a machine without an accelerator the model and the reader share the same
cores, so the reader also slows the model down; the figures still say which
one a step waits for.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from readers import dataset as _dataset
from readers.metadata import SplitFiles, load_split
from readers.options import AUGMENTATIONS, LABEL_MODES, ReaderConfig
from schemas.manifest import is_url

__all__ = ["INPUT_BOUND_SHARE", "STAGES", "DoctorOptions", "Diagnosis", "diagnose", "load_model"]

logger = logging.getLogger(__name__)

# From this share of each step spent waiting for input on, a run is input-bound
# (below it the difference is within what timing on shared cores can tell).
INPUT_BOUND_SHARE = 0.1
# ... and from this share of its time blocked waiting for the next batch on.
_BLOCKED_SHARE = INPUT_BOUND_SHARE / 2
# The reader's stages, in pipeline order, as the report names them.
STAGES = ("read", "decode", "augment")
# Decoded batches held in memory for the "cached" measurement.
_CACHED_BATCHES = 4
# Rounds of the model runs (the best of each kind is kept).
_ROUNDS = 3
# Fewest batches timed for the reader alone and its stages.
_MIN_READER_BATCHES = 20
# Seeds of the reader, so that the warm and cold runs read the same records.
_SEED = 0
_NO_CACHE_DROP_FS = ("tmpfs", "ramfs")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class DoctorOptions:
    """What `diagnose` measures; validated on construction.

    Attributes:
      batch_size: Examples per step.
      image_size: (height, width) the reader resizes to: the model's input.
      steps: Timed steps (or batches) of each measurement.
      warmup: Untimed steps before each (tracing, pipeline start, buffers).
      augment: The reader's `augment`: None or 'standard'.
      label_mode: The reader's `label_mode` (what the model's loss takes).
      cold: Also measure from a cold page cache (when the files allow it).
    """

    batch_size: int = 32
    image_size: tuple[int, int] = (224, 224)
    steps: int = 50
    warmup: int = 5
    augment: str | None = None
    label_mode: str | None = "int"
    cold: bool = True

    def __post_init__(self):
        for name, low in (("batch_size", 1), ("steps", 1), ("warmup", 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                raise ValueError(
                    f"`{name}` must be an integer >= {low}. Received: {name}={value!r}"
                )
        size = self.image_size
        if (not isinstance(size, (tuple, list)) or len(size) != 2
                or not all(_is_int(s) and s > 0 for s in size)):
            raise ValueError(
                "`image_size` must be two positive integers (height, width). "
                f"Received: image_size={size!r}"
            )
        object.__setattr__(self, "image_size", tuple(size))
        if self.augment not in AUGMENTATIONS:
            raise ValueError(
                f"`augment` must be one of {AUGMENTATIONS}. Received: augment={self.augment!r}"
            )
        if self.label_mode not in LABEL_MODES:
            raise ValueError(
                f"`label_mode` must be one of {LABEL_MODES}. "
                f"Received: label_mode={self.label_mode!r}"
            )
        if not isinstance(self.cold, bool):
            raise TypeError(f"`cold` must be True or False. Received: cold={self.cold!r}")


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What `diagnose` measured, and what it makes of it.

    Attributes:
      device: Where the model ran ('GPU' or 'CPU').
      batch_size: Examples per step.
      ceiling_steps_per_s: Steps/s on batches already on the device.
      cached_steps_per_s: Steps/s on decoded batches held in memory.
      warm_steps_per_s: Steps/s with the reader, warm page cache.
      cold_steps_per_s: Steps/s with the reader, cold page cache; None when
        not measured (see `cold_note`).
      cold_note: Why the cold page cache was not measured, or None.
      reader_images_per_s: The reader alone (no model), warm.
      stage_images_per_s: Images/s of the reader cut after each stage
        ('read': records only; 'decode': parsed, decoded and resized;
        'augment': with the augmentation, absent without one), in order.
      wait_share: Share of each step spent waiting for input, warm:
        1 - warm / ceiling, in [0, 1].
      cold_wait_share: The same from a cold page cache, or None.
      blocked_share: Share of the warm run's time spent blocked in the
        reader's `next`, measured in that run itself (so steadier on a
        shared machine than the ratio of two runs), beyond what `next` costs
        when the batch is ready (its least cost per call on the cached
        batches).
      cold_blocked_share: The same from a cold page cache, or None.
      input_bound: `wait_share` (or `cold_wait_share`) reaches
        `INPUT_BOUND_SHARE` and the steps of that run did wait in `next`
        (`blocked_share` at least half of that): a slowdown without waiting
        is the reader taking cores from the model, not a stall.
      bound_stage: The stage adding the most time per image ('read',
        'decode' or 'augment'); 'read' also when only the cold cache makes
        the run input-bound.
      text: One paragraph saying all of it, with what to try.
    """

    device: str
    batch_size: int
    ceiling_steps_per_s: float
    cached_steps_per_s: float
    warm_steps_per_s: float
    cold_steps_per_s: float | None
    cold_note: str | None
    reader_images_per_s: float
    stage_images_per_s: tuple[tuple[str, float], ...]
    wait_share: float
    cold_wait_share: float | None
    blocked_share: float
    cold_blocked_share: float | None
    input_bound: bool
    bound_stage: str
    text: str

    def stage_ms_per_image(self) -> dict[str, float]:
        """The time each stage adds per image, in ms (by difference, at least 0)."""
        out, before = {}, 0.0
        for name, rate in self.stage_images_per_s:
            total = 1000.0 / rate
            out[name] = max(0.0, total - before)
            before = max(before, total)
        return out


# ---------------------------------------------------------------------------
# The model.


def load_model(model: Any):
    """A compiled Keras model from a model, a `.keras` file or 'module:function'.

    Args:
      model: A compiled `keras.Model`; the path of a saved model (`.keras`,
        loaded with `keras.models.load_model`, compiled as saved); or
        'module:function', a function of an importable module (the current
        folder included) that takes no argument and returns a compiled model;
        or such a function itself.

    Raises:
      ValueError: If the file, module or function is not found, or the model
        is not compiled (no optimizer: it cannot train).
    """
    import keras

    name = model
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if text.endswith(".keras") or os.path.exists(text):
            if not os.path.isfile(text):
                raise ValueError(f"`model`: no such file. Received: model={text!r}")
            model = keras.models.load_model(text)
        elif ":" in text:
            model = _call_factory(text)
        else:
            raise ValueError(
                "`model` must be a saved model file (.keras) or 'module:function' returning "
                f"a compiled Keras model. Received: model={text!r}"
            )
    elif callable(model) and not isinstance(model, keras.Model):
        model = model()
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"`model` must give a keras.Model. Received: model={name!r}, which gave {model!r}"
        )
    if getattr(model, "optimizer", None) is None:
        raise ValueError(
            "`model` must be compiled (an optimizer and a loss), as for model.fit. "
            f"Received: model={name!r}, not compiled"
        )
    return model


def _call_factory(spec: str):
    module_name, _, function = spec.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # 'module:function' of the user's own folder.
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"`model`: cannot import {module_name!r} ({e}). Received: "
                         f"model={spec!r}") from e
    factory = getattr(module, function, None)
    if not callable(factory):
        raise ValueError(f"`model`: module {module_name!r} has no function {function!r}. "
                         f"Received: model={spec!r}")
    return factory()


def _check_input(model, options: DoctorOptions) -> None:
    shape = getattr(model, "input_shape", None)
    if isinstance(shape, tuple) and len(shape) == 4 and all(
            s is not None for s in shape[1:3]):
        if tuple(shape[1:3]) != options.image_size:
            raise ValueError(
                f"`image_size` must be the model's input size {tuple(shape[1:3])}. "
                f"Received: image_size={options.image_size!r}"
            )


# ---------------------------------------------------------------------------
# Timing.


class _Timed:
    """Steps/s of one run, and the share of its time spent blocked in `next`."""

    def __init__(self, steps_per_s: float = 0.0, blocked: float = 1.0):
        self.steps_per_s, self.blocked = steps_per_s, blocked

    def best(self, other: _Timed) -> _Timed:
        return other if other.steps_per_s > self.steps_per_s else self

    @property
    def next_s(self) -> float:
        """Seconds in `next` per step."""
        return self.blocked / self.steps_per_s if self.steps_per_s else float("inf")

    def beyond(self, next_s: float) -> _Timed:
        """This run with `next_s` seconds of each call of `next` not counted as blocked."""
        return _Timed(self.steps_per_s, max(0.0, self.blocked - next_s * self.steps_per_s))


def _run(batches: Iterator, step: Callable, *, warmup: int, steps: int) -> _Timed:
    """Times `step(batch)` over `steps` batches of `batches`, after `warmup`."""
    for _ in range(warmup):
        step(next(batches))
    waited = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        asked = time.perf_counter()
        batch = next(batches)
        waited += time.perf_counter() - asked
        step(batch)
    span = time.perf_counter() - start
    return _Timed(steps / span, waited / span)


def _steps_per_s(batches: Iterator, step: Callable, *, warmup: int, steps: int) -> float:
    return _run(batches, step, warmup=warmup, steps=steps).steps_per_s


def _train_step(model) -> Callable:
    def step(batch):
        if isinstance(batch, tuple):
            model.train_on_batch(*batch)  # Returns the loss: the step has finished.
        else:
            model.train_on_batch(batch)
    return step


def _consume(_batch) -> None:
    """The reader alone: the batch is there, nothing else."""


def _device() -> str:
    return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"


# ---------------------------------------------------------------------------
# The page cache.


def _filesystem(path: str) -> str | None:
    """The type of the filesystem holding `path` (Linux's /proc/mounts), or None."""
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) > 2]
    except OSError:
        return None
    real = os.path.realpath(path)
    best = None
    for point, fstype in mounts:
        if (real == point or real.startswith(point.rstrip("/") + "/")) and (
                best is None or len(point) > len(best[0])):
            best = (point, fstype)
    return best[1] if best else None


def _why_no_cold(split_files: SplitFiles) -> str | None:
    """Why the split's files cannot be dropped from the page cache, or None."""
    if not hasattr(os, "posix_fadvise"):
        return "this system has no posix_fadvise (Linux only)"
    if any(is_url(p) for p in split_files.paths):
        return "the shards are not local files (a URL): there is no local page cache to drop"
    fstype = _filesystem(split_files.paths[0])
    if fstype in _NO_CACHE_DROP_FS:
        return f"the shards are on {fstype}, which lives in memory: they cannot be made cold"
    return None


def _drop_from_page_cache(paths) -> None:
    """posix_fadvise(DONTNEED) on each file (after flushing it: dirty pages stay)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------
# The datasets.


def _config(options: DoctorOptions, augment) -> ReaderConfig:
    return ReaderConfig(
        batch_size=options.batch_size, image_size=options.image_size, augment=augment,
        label_mode=options.label_mode, repeat=True, drop_remainder=True, seed=_SEED,
        deterministic=False,
    )


def _reader(split_files: SplitFiles, options: DoctorOptions, augment) -> tf.data.Dataset:
    config = _config(options, augment)
    return _dataset.build_dataset(split_files, config, batch_size=options.batch_size)


def _records_only(split_files: SplitFiles, options: DoctorOptions) -> tf.data.Dataset:
    """The reader's record stage alone (files, interleave, shuffle buffer), batched."""
    config = _config(options, None)
    records, _, _ = _dataset._records(split_files, config, pipeline_id=0, num_pipelines=1)
    return records.batch(options.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _cached(batches: list) -> tf.data.Dataset:
    """Decoded batches in memory, fed through tf.data as a reader would."""
    stacked = tf.nest.map_structure(lambda *xs: tf.stack(xs), *batches)
    return tf.data.Dataset.from_tensor_slices(stacked).repeat().prefetch(tf.data.AUTOTUNE)


def _on_device(batch, device: str):
    with tf.device(f"/{device}:0"):
        return tf.nest.map_structure(tf.identity, batch)


def _cycle(batches: list) -> Iterator:
    # A few real batches in turn, not one: the same batch again and again
    # trains the model towards values it would not see in training.
    while True:
        yield from batches


# ---------------------------------------------------------------------------
# The diagnosis.


def diagnose(data_dir: str | os.PathLike, split: str = "train", model: Any = None,
             options: DoctorOptions | None = None) -> Diagnosis:
    """Measures where each training step of `model` on `split` waits, and says so.

    Runs `model.train_on_batch` on its own input in turn (see the module's
    docstring): batches on the device (the ceiling), decoded batches in
    memory, the reader on a warm page cache (best of three rounds of the
    three), then on a cold one; and the reader alone, cut after each stage.
    The model is trained for real during the measurements (its weights
    change).

    Args:
      data_dir: The dataset folder (the converter's `--output_dir`).
      split: The split to read.
      model: A compiled `keras.Model`, a saved model file (`.keras`), or
        'module:function' returning a compiled model (see `load_model`).
      options: A `DoctorOptions`; None for its defaults.

    Returns:
      The `Diagnosis`, its `text` the paragraph to print.

    Raises:
      ValueError: If `model` or an option is invalid (the message names it).
      FileNotFoundError, schemas.ManifestError: If `data_dir` is not a
        dataset or has no such split.
    """
    options = options or DoctorOptions()
    if not isinstance(options, DoctorOptions):
        raise TypeError(f"`options` must be a DoctorOptions. Received: options={options!r}")
    if model is None:
        raise ValueError("`model` is required: a compiled keras.Model, a .keras file or "
                         "'module:function'. Received: model=None")
    model = load_model(model)
    _check_input(model, options)
    split_files = load_split(data_dir, split)
    device = _device()
    step, n = _train_step(model), options.batch_size
    timing = {"warmup": options.warmup, "steps": options.steps}

    # The reader alone first: it also warms the page cache for the records
    # the warm run reads (the same seed reads the same records).
    reader_rate = n * _steps_per_s(iter(_reader(split_files, options, options.augment)),
                                   _consume, warmup=options.warmup,
                                   steps=max(options.steps, _MIN_READER_BATCHES))
    logger.info("Reader alone: %.1f images/s", reader_rate)

    ceiling, cached, warm, ready_next_s = _model_runs(split_files, options, step, device, timing)
    stages = _reader_stages(split_files, options, reader_rate)
    cold, cold_note = _cold_run(split_files, options, step, timing, ready_next_s)
    return _diagnosis(device=device, batch_size=n, ceiling=ceiling, cached=cached, warm=warm,
                      cold=cold, cold_note=cold_note, reader_rate=reader_rate,
                      stages=tuple(stages), augment=options.augment)


def _model_runs(split_files, options: DoctorOptions, step, device: str, timing: dict):
    """The model's steps/s on batches on the device (the ceiling), on decoded batches in memory,
    and on the reader with a warm page cache, in rounds, each its best; and what `next` costs
    with a batch already there."""
    it = iter(_reader(split_files, options, options.augment))
    batches = [next(it) for _ in range(_CACHED_BATCHES)]
    del it
    on_device = [_on_device(b, device) for b in batches]
    # The three model runs in rounds, each its best: a load that comes and
    # goes on shared cores then weighs on all three alike.
    ceiling = cached = 0.0
    warm = _Timed()
    ready_next_s = float("inf")  # What `next` costs with the batch already there.
    for _ in range(_ROUNDS):
        ceiling = max(ceiling, _steps_per_s(_cycle(on_device), step, **timing))
        from_memory = _run(iter(_cached(batches)), step, **timing)
        cached = max(cached, from_memory.steps_per_s)
        ready_next_s = min(ready_next_s, from_memory.next_s)
        warm = warm.best(_run(iter(_reader(split_files, options, options.augment)), step,
                              **timing))
    warm = warm.beyond(ready_next_s)
    logger.info("Steps/s: ceiling %.2f, cached batches %.2f, reader on a warm page cache %.2f "
                "(%.0f%% blocked in next beyond its %.2f ms with a batch ready)", ceiling, cached,
                warm.steps_per_s, 100 * warm.blocked, 1000 * ready_next_s)
    return ceiling, cached, warm, ready_next_s


def _reader_stages(split_files, options: DoctorOptions, reader_rate: float) -> list:
    """(stage, images/s) of the reader alone, cut after each stage (the whole reader's is `reader_rate`)."""
    n = options.batch_size
    # The reader alone is cheap per batch: more batches, for steadier figures.
    alone = {"warmup": options.warmup, "steps": max(options.steps, _MIN_READER_BATCHES)}
    stages = [("read", n * _steps_per_s(iter(_records_only(split_files, options)),
                                        _consume, **alone))]
    decoded = n * _steps_per_s(iter(_reader(split_files, options, None)), _consume, **alone)
    if options.augment is None:
        stages.append(("decode", max(decoded, reader_rate)))
    else:
        stages.append(("decode", decoded))
        stages.append(("augment", reader_rate))
    logger.info("Reader cut after each stage: %s",
                ", ".join(f"{name} {rate:.1f} images/s" for name, rate in stages))
    return stages


def _cold_run(split_files, options: DoctorOptions, step, timing: dict, ready_next_s: float):
    """The model's run on the reader with a cold page cache, or None and why not."""
    cold, cold_note = None, None
    if not options.cold:
        cold_note = "not asked for"
    else:
        cold_note = _why_no_cold(split_files)
        if cold_note is None:
            _drop_from_page_cache(split_files.paths)
            cold = _run(iter(_reader(split_files, options, options.augment)), step,
                        **timing).beyond(ready_next_s)
            logger.info("Reader, cold page cache: %.2f steps/s (%.0f%% blocked in next)",
                        cold.steps_per_s, 100 * cold.blocked)
    return cold, cold_note


def _share(rate: float | None, ceiling: float) -> float | None:
    if rate is None:
        return None
    return min(1.0, max(0.0, 1.0 - rate / ceiling))


def _is_bound(share: float | None, blocked: float | None) -> bool:
    """Slower than the ceiling, and because the step waited for its batch: a
    slowdown without waiting in `next` is the reader taking cores from the
    model, or the machine's load changing between runs."""
    return (share is not None and share >= INPUT_BOUND_SHARE
            and blocked >= _BLOCKED_SHARE)


def _diagnosis(*, device, batch_size, ceiling, cached, warm, cold, cold_note, reader_rate,
               stages, augment) -> Diagnosis:
    """The figures, the verdict and its paragraph."""
    wait = _share(warm.steps_per_s, ceiling)
    cold_wait = None if cold is None else _share(cold.steps_per_s, ceiling)
    partial = Diagnosis(
        device=device, batch_size=batch_size, ceiling_steps_per_s=ceiling,
        cached_steps_per_s=cached, warm_steps_per_s=warm.steps_per_s,
        cold_steps_per_s=None if cold is None else cold.steps_per_s,
        cold_note=cold_note, reader_images_per_s=reader_rate, stage_images_per_s=stages,
        wait_share=wait, cold_wait_share=cold_wait, blocked_share=warm.blocked,
        cold_blocked_share=None if cold is None else cold.blocked,
        input_bound=False, bound_stage="", text="",
    )
    costs = partial.stage_ms_per_image()
    warm_bound = _is_bound(wait, warm.blocked)
    cold_bound = _is_bound(cold_wait, partial.cold_blocked_share)
    bound_stage = max(costs, key=costs.get)
    if cold_bound and not warm_bound:
        bound_stage = "read"  # Storage: only the cold page cache stalls.
    result = dataclasses.replace(partial, input_bound=warm_bound or cold_bound,
                                 bound_stage=bound_stage)
    return dataclasses.replace(
        result, text=_paragraph(result, costs, augment, warm_bound=warm_bound))


_ADVICE = {
    "read": ("reading records bounds it: keep the shards on local disk, read them with "
             "`cache=True` (records held in memory after the first epoch) if they fit, or "
             "spread the reading over tf.data service workers (`shardsmith serve-data`)"),
    "decode": ("decoding bounds it: spread the decoding over tf.data service workers on more "
               "cores or hosts (`shardsmith serve-data`), or store smaller images (convert again "
               "with `--max_side` near the training size: fewer pixels to decode)"),
    "augment": ("augmentation bounds it: spread it over tf.data service workers "
                "(`shardsmith serve-data`), or move it into the model (Keras preprocessing "
                "layers run on the device)"),
}


def _paragraph(d: Diagnosis, costs: dict[str, float], augment, *, warm_bound: bool) -> str:
    steps = (f"the model alone runs {d.ceiling_steps_per_s:.1f} steps/s of {d.batch_size} "
             f"on batches kept on the {d.device}, {d.cached_steps_per_s:.1f} on decoded "
             f"batches from memory and {d.warm_steps_per_s:.1f} with the reader on a warm "
             f"page cache (blocked in next {100 * d.blocked_share:.0f}% of the time)")
    if d.cold_steps_per_s is not None:
        steps += (f", {d.cold_steps_per_s:.1f} on a cold one ({100 * d.cold_wait_share:.0f}% "
                  f"below the ceiling, blocked {100 * d.cold_blocked_share:.0f}%)")
    else:
        steps += f" (cold page cache not measured: {d.cold_note})"
    stage_text = "; ".join(
        f"{name} {rate:,.0f} images/s (+{costs[name]:.2f} ms/image)"
        for name, rate in d.stage_images_per_s
    )
    if augment is None:
        stage_text += "; no augmentation"
    reader = (f"The reader alone gives {d.reader_images_per_s:,.0f} images/s, the model takes "
              f"{d.ceiling_steps_per_s * d.batch_size:,.0f}; cut after each stage: {stage_text}.")
    if d.input_bound:
        verdict = (f"Input-bound: each step waits {100 * d.wait_share:.0f}% of its time for "
                   f"input on a warm page cache (1 - {d.warm_steps_per_s:.1f} / "
                   f"{d.ceiling_steps_per_s:.1f} steps/s): {steps}.")
        if not warm_bound:
            verdict = (f"Input-bound from storage: on a warm page cache steps wait only "
                       f"{100 * d.wait_share:.0f}%, but {100 * d.cold_wait_share:.0f}% on a cold "
                       f"one: {steps}.")
        advice = _ADVICE[d.bound_stage][0].upper() + _ADVICE[d.bound_stage][1:] + "."
        if (d.cold_wait_share is not None and d.cold_wait_share >= INPUT_BOUND_SHARE
                and d.cold_wait_share - d.wait_share >= INPUT_BOUND_SHARE
                and d.bound_stage != "read"):
            advice += (" From a cold page cache reading adds a fetch stall too: "
                       f"{_ADVICE['read'].split(': ', 1)[1]}.")
    elif d.wait_share >= INPUT_BOUND_SHARE:
        verdict = (f"Not input-bound: steps ran {100 * d.wait_share:.0f}% slower with the reader "
                   f"than on the device's own batches, but waited for a batch only "
                   f"{100 * d.blocked_share:.0f}% of the time: the reader takes cores from the "
                   f"model (or the machine's load changed between the runs): {steps}.")
    else:
        verdict = (f"Not input-bound: steps wait {100 * d.wait_share:.0f}% of their time for "
                   f"input (below {100 * INPUT_BOUND_SHARE:.0f}%): {steps}.")
    if not d.input_bound:
        advice = (f"The model is the limit; a faster reader would not speed training. Of the "
                  f"reader's stages, {d.bound_stage} costs the most.")
    if d.cached_steps_per_s < (1 - INPUT_BOUND_SHARE) * d.ceiling_steps_per_s:
        advice += (" Even decoded batches from memory run "
                   f"{100 * (1 - d.cached_steps_per_s / d.ceiling_steps_per_s):.0f}% below the "
                   "ceiling: the hand-off and copy to the device cost (try `dtype='uint8'` for "
                   "a smaller copy).")
    if d.device == "CPU":
        advice += (" No accelerator here: the model and the reader share the CPU cores, so "
                   "the reader also slows the model.")
    return " ".join((verdict, reader, advice))

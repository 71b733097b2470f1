"""Host memory for the input pipeline: TensorFlow's pooling (BFC) allocator.

`readers.use_pooled_host_memory()` is a trainer's explicit choice; importing
`readers` changes nothing.

Where TensorFlow's CPU allocator is `malloc` (TF 2.21 on a CPU without
AVX-512, or with `TF_ENABLE_ONEDNN_OPTS=0`), a batch of images at the model's
size is a large block (32 x 224 x 224 x 3 float32 is 19 MB), and glibc serves
blocks that large from fresh `mmap`s, or from per-thread heaps that it unmaps
as soon as they are empty: every batch then page-faults its memory in again,
zero-filled by the kernel, before the resize writes it. For small images read
at 224x224 that was a third of the reader's CPU time (0.50 -> 0.39 ms per
64x64 image; photos 3.45 -> 3.33 ms), and peak memory fell too (675 -> 632
MiB), because freed blocks are reused instead of returned. Where TensorFlow's
oneDNN path is on (the default on CPUs with AVX-512), TensorFlow already pools
host memory and the call changes little (docs/reading/reader.md, docs/performance.md).

TensorFlow's pool for host memory is chosen by the environment variable
`TF_CPU_ALLOCATOR_USE_BFC` when it creates its CPU device, i.e. at the first
op, not at import. `use_pooled_host_memory` sets it, unless:

- the user set `TF_CPU_ALLOCATOR_USE_BFC` (to anything: `false` keeps
  `malloc`), or
- TensorFlow already ran an op in this process (its allocator exists): then
  nothing changes, and an INFO log says how to get the pool.

The pool's default ceiling is 64 GiB (`TF_CPU_BFC_MEM_LIMIT_IN_MB`); on a
machine with more memory than that it is raised to the machine's memory, so a
large `cache()` does not fail where `malloc` would have succeeded.
"""

from __future__ import annotations

import logging
import os

from compat import UntestedVersion, tf_internals

__all__ = ["use_pooled_host_memory"]

_LOG = logging.getLogger("shardsmith.readers")

USE_BFC = "TF_CPU_ALLOCATOR_USE_BFC"
MEM_LIMIT_MB = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
# TensorFlow's default for MEM_LIMIT_MB (tensorflow/core/common_runtime/process_state.cc).
_TF_DEFAULT_LIMIT_MB = 1 << 16


def _tensorflow_started() -> bool:
    """Whether TensorFlow created its devices (and so its allocator) already."""
    try:
        return tf_internals.context_initialized()
    except UntestedVersion as e:
        # Cannot tell: setting the variable is harmless if it is too late.
        _LOG.debug("Cannot tell whether TensorFlow started: %s", e)
        return False


def _physical_memory_mb() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    except (ValueError, OSError, AttributeError):
        # Not every platform names these (macOS has no SC_PHYS_PAGES).
        return None


def use_pooled_host_memory() -> bool:
    """Gives TensorFlow's host memory a pool (the BFC allocator), if still possible.

    Call it at the start of a training script, before TensorFlow runs its
    first op. It sets `TF_CPU_ALLOCATOR_USE_BFC=true` (and raises the pool's
    ceiling to the machine's memory when that is above TensorFlow's 64 GiB),
    unless the user set that variable already (their setting stands) or
    TensorFlow has started (then an INFO log says so and nothing changes).

    Returns:
      True if this call chose the pool; False if the user's setting stands or
      TensorFlow had started already.
    """
    if USE_BFC in os.environ:
        _LOG.debug("%s=%s set by the user; left as it is.", USE_BFC, os.environ[USE_BFC])
        return False
    if _tensorflow_started():
        _LOG.info(
            "TensorFlow ran ops before readers.use_pooled_host_memory() was called, so its "
            "host memory allocator stays as it is. Call it first, or set %s=true before "
            "TensorFlow starts.", USE_BFC)
        return False
    os.environ[USE_BFC] = "true"
    physical = _physical_memory_mb()
    if MEM_LIMIT_MB not in os.environ and physical and physical > _TF_DEFAULT_LIMIT_MB:
        os.environ[MEM_LIMIT_MB] = str(physical)
    return True

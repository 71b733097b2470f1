"""Beam pipelines of shardsmith: conversion of image folders to TFRecord shards."""

import logging
import os


class _BigQueryNotice(logging.Filter):
    """Drops Beam's import-time notice about BigQuery clients we never use.

    With the light GCS client installed (the `test` and `gcp` extras), Beam
    logs "apitools not found ..." on the root logger at import, before any
    logging is configured, on every run.
    """

    def filter(self, record):
        return not str(record.msg).startswith("apitools not found")


logging.getLogger().addFilter(_BigQueryNotice())

# TensorFlow's C++ start-up lines (oneDNN, CPU features) bury the pipeline's
# own output; a user who wants them sets the variable.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__all__ = ["ConversionConfig", "ConvertImages", "ConvertOptions", "run"]


def __getattr__(name):
    # Imported lazily: `python -m beam_jobs.convert` must not import the module
    # twice (once through the package, once as __main__).
    if name in __all__:
        from beam_jobs import convert

        return getattr(convert, name)
    raise AttributeError(f"module 'beam_jobs' has no attribute {name!r}")

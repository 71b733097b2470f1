"""Beam pipelines of shardsmith: conversion of image folders to TFRecord shards.

Importing the package changes nothing in the process: the entry points
(`main` of `beam_jobs.convert` and `beam_jobs.verify`) configure logging and
quiet TensorFlow's C++ lines (conversion/console.py).
"""

__all__ = ["ConversionConfig", "ConvertImages", "ConvertOptions", "config_from_options", "run"]


def __getattr__(name):
    # Imported lazily: `python -m beam_jobs.convert` must not import the module
    # twice (once through the package, once as __main__).
    if name in __all__:
        from beam_jobs import convert

        return getattr(convert, name)
    raise AttributeError(f"module 'beam_jobs' has no attribute {name!r}")

"""The `shardsmith` command: convert, verify, inspect and preview datasets.

The work itself lives in the libraries: `beam_jobs` (the Beam pipelines),
`imaging` (one file to a storable image), `schemas` (the record format) and
`readers` (tf.data). This package holds the command line around them.
"""

from schemas._version import __version__

__all__ = ["__version__"]

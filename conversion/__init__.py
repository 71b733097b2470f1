"""What a conversion does without Beam: list, plan, write shards, guard against bad files.

The pipelines of `beam_jobs` run these steps on a runner's workers; the
worker processes of `conversion.processes` run them without importing Beam
or TensorFlow's Python API for local files. `conversion.console` is the
logging and quiet console of every entry point. Importing the package, or
any module of it, changes nothing in the process.
"""

__all__: list[str] = []

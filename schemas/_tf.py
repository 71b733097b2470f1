"""TensorFlow, imported with Python's garbage collector paused.

Importing TensorFlow creates about a million Python objects. With the
collector on, it runs many full collections during the import, and every later
full collection (and interpreter exit) scans those objects again: more than a
second of CPU in every process, which for a conversion that starts several
workers, or a short job, is a large share of the run. Freezing moves the
import's objects to the permanent generation, where the collector leaves them.
"""

import gc


def _import_tensorflow():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        import tensorflow
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
    return tensorflow


tf = _import_tensorflow()

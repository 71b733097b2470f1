"""Quarantine for code that relies on private internals of TensorFlow, Beam or pydicom.

Every use of a library's private modules, attributes or constants lives in
this package, one module per library (`tf_internals`, `beam_internals`), so
that a new release breaks one small, known place. Each module states the
library versions it was tested with and checks the installed version at use
(never at import): outside that range `UntestedVersion` says which library,
which version and what was tested. Callers with a public fallback catch it and
take the slower public way; the others let it reach the user.

pydicom needs no module here: shardsmith uses its public API only.
"""

from compat._versions import UntestedVersion

__all__ = ["UntestedVersion"]

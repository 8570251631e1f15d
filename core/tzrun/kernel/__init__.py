"""The plugin kernel: the plugin manager (loading, blocking, isolation), the registries by
kind, the hook-name checks, the conformance checks of named components and the ``plugins``
report. It knows nothing of training; the run (:mod:`tzrun.runner`) is built on it."""

"""tzrec-run's first-party plugins.

Each subpackage has a ``hooks.py``, an entry point of the ``tzrun`` group that registers its
components through the public hooks, exactly as a third-party plugin would. Nothing here is
imported by the core.
"""

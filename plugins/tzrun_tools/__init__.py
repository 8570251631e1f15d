"""Tooling around runs, not part of one: synthetic data (``synth``, ``synth_taobao``,
``criteo_text``), ``tzrec-run convert`` (``convert``), the generated reference pages
(``reference``), ``tzrec-run plot`` (``plot``) and ``tzrec-run new-plugin`` (``scaffold``).

The kernel (config, plugins, registries, data, runner) never imports this package; the
command line and :mod:`tzrun.testing` do.
"""

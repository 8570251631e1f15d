"""MkDocs hook: adds the generated reference pages (``reference/*.md``) to the site.

The pages are built from the code at every ``mkdocs build``/``serve`` (see :mod:`tzrun_tools.reference`),
from the plugins installed in the environment that runs MkDocs, exactly as ``tzrec-run plugins``
finds them; none of them is committed, so none can drift. A plugin that fails to load is a
warning, which ``strict: true`` turns into a failed build.
"""

from __future__ import annotations

import logging

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from tzrun.kernel.plugins import make_plugin_manager
from tzrun_tools.reference import config_reference, hooks_reference
from tzrun.kernel.registry import collect_registries

log = logging.getLogger(f"mkdocs.hooks.{__name__}")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add every generated page; a hand-written file at a generated page's path is an error."""
    pm = make_plugin_manager()
    for failure in pm.load_failures:
        log.warning("the reference pages lack the components of %s", failure)
    pages = {**config_reference(collect_registries(pm)), "reference/hooks.md": hooks_reference()}
    for src_uri, content in pages.items():
        if files.get_file_from_path(src_uri) is not None:
            raise ValueError(f"docs/{src_uri} is generated from the code by docs/_hooks/reference.py; remove the file")
        files.append(File.generated(config, src_uri, content=content))
    return files

"""Reference pages generated from the code: the config schema, every registered component, every hook.

The MkDocs hook ``docs/_hooks/reference.py`` adds these pages to the site at build time, so none
of them is committed and none can drift from the code. Nothing here imports torch.

Order is deterministic: kinds in :data:`tzrun.kernel.registry.KINDS` order, components sorted by name
(the registries' order), keys in attrs field order (as the classes declare them), hooks in the
order :mod:`tzrun.hookspecs` defines them. Key documentation comes from the Google-style
``Attributes:`` section of each class docstring (or, failing that, an attribute docstring below
the field), inherited along the class's MRO.

Modules: :mod:`~tzrun_tools.reference.docstrings` (``Attributes:`` sections, RST as Markdown),
:mod:`~tzrun_tools.reference.fields` (a key's type, bounds and default), :mod:`~tzrun_tools.reference.config_page`
(the core schema, :data:`COMPONENT_SLOTS`), :mod:`~tzrun_tools.reference.components` (the kind pages and
the index) and :mod:`~tzrun_tools.reference.hooks_page`.
"""

from __future__ import annotations

from tzrun_tools.reference.components import config_reference
from tzrun_tools.reference.config_page import COMPONENT_SLOTS, Slot
from tzrun_tools.reference.docstrings import attribute_docs, docstring_markdown, docstring_problems, parse_attributes
from tzrun_tools.reference.hooks_page import hooks_reference

__all__ = [
    "COMPONENT_SLOTS",
    "Slot",
    "attribute_docs",
    "config_reference",
    "docstring_markdown",
    "docstring_problems",
    "hooks_reference",
    "parse_attributes",
]

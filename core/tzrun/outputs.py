"""Directories a plugin writes outside a model dir (an export, a dump, a prediction set), by the
rules every output of tzrec-run obeys (docs/checkpoints.md, "Trust"): a marker written before
anything else, and only a directory with the marker, holding nothing but what that kind of
output writes, is ever emptied or replaced. See :func:`claim_output_dir`."""

from __future__ import annotations

from tzrun.io.owned import OUTPUT_MARKER, claim_output_dir, output_entries, read_output_marker, remove_owned
from tzrun.io.storage import remove_tree

__all__ = ["OUTPUT_MARKER", "claim_output_dir", "output_entries", "read_output_marker", "remove_owned", "remove_tree"]

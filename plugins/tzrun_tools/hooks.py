"""Registers the tools' plugin commands: ``tzrec-run tdm-tree`` and ``tzrec-run tdm-retrieve``."""

from __future__ import annotations

import tzrun


@tzrun.hookimpl
def tzrun_register_commands(register: tzrun.Register) -> None:
    from tzrun_tools import tdm_retrieve, tdm_tree

    register("tdm_tree", config=tdm_tree.TDMTreeOptions, build=tdm_tree.tdm_tree,
             description="TDM's initial tree from an item table (items sorted by category, a balanced k-ary "
                         "tree, as TorchEasyRec's init_tree): writes the node table")
    register("tdm_retrieve", config=tdm_retrieve.TDMRetrieveOptions, build=tdm_retrieve.tdm_retrieve,
             description="TDM's retrieval: for each user row, a beam search through the tree scored by an "
                         "exported tdm model; writes the top-k item ids")

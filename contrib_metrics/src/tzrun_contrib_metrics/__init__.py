"""tzrun-contrib-metrics: exact ranking and calibration metrics for tzrec-run, as a plugin.

Metrics (name them in ``[[metrics]]``; definitions in the README and each module):

* ``ndcg_at_k``: NDCG@k per group (query, user: ``group_by``), averaged over groups;
* ``average_precision``: the area under the precision-recall curve, as
  ``sklearn.metrics.average_precision_score`` computes it;
* ``copc``: clicks over predicted clicks, pooled, or per group and averaged.

Each keeps what it needs of every row and computes over all ranks' rows at the end, so the
value does not depend on how rows were split across ranks. Found through the ``tzrun`` entry
point (:mod:`tzrun_contrib_metrics.hooks`); importing the package registers nothing.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

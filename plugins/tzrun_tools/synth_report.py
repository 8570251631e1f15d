"""The report :func:`tzrun_tools.synth.synth_criteo` writes next to its data (``synth.json``)
and reads back."""

from __future__ import annotations

import os
from typing import Any, Iterable

import attrs

from tzrun_tools.synth_common import nan_to_none, none_to_nan, read_document, report_fields

__all__ = ["SynthReport", "read_report"]


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _names(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen
class SynthReport:
    """What :func:`synth_criteo` wrote, and the best AUC achievable on it.

    Attributes:
        out_dir: the directory holding ``train/``, ``eval/`` and ``synth.json``.
        train_rows: rows in ``train/``.
        eval_rows: rows in ``eval/``.
        seed: the seed the data and the ground-truth model were drawn from.
        positive_rate: the fraction of label 1 in the train split.
        bayes_auc: AUC of the true click probability against the drawn labels of the eval
            split: the ceiling for any model evaluated on it (NaN when the eval split holds a
            single class).
        bayes_auc_train: the same on the train split.
        cardinalities: the number of ids of each of the 26 categorical columns (of a drifting
            column: the number its fixed ids would have; its drifting ids have no bound).
        drift_columns: the columns whose ids drift (``--drift``), or none.
    """

    out_dir: str
    train_rows: int
    eval_rows: int
    seed: int
    positive_rate: float
    bayes_auc: float
    bayes_auc_train: float
    cardinalities: tuple[int, ...] = attrs.field(converter=_ints)
    drift_columns: tuple[str, ...] = attrs.field(default=(), converter=_names)

    def to_json(self) -> dict[str, Any]:
        """Return the report as a JSON-serializable dict (NaN AUCs become None)."""
        return {
            "out_dir": self.out_dir,
            "train_rows": self.train_rows,
            "eval_rows": self.eval_rows,
            "seed": self.seed,
            "positive_rate": nan_to_none(self.positive_rate),
            "bayes_auc": nan_to_none(self.bayes_auc),
            "bayes_auc_train": nan_to_none(self.bayes_auc_train),
            "cardinalities": list(self.cardinalities),
            "drift_columns": list(self.drift_columns),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SynthReport:
        """Build a report from :meth:`to_json` output; unknown keys are ignored.

        Args:
            data: a dict as returned by :meth:`to_json` (or read from ``synth.json``).

        Returns:
            The report.

        Raises:
            ValueError: a field is missing.
        """
        with report_fields("criteo"):
            return cls(
                out_dir=str(data["out_dir"]),
                train_rows=int(data["train_rows"]),
                eval_rows=int(data["eval_rows"]),
                seed=int(data["seed"]),
                positive_rate=none_to_nan(data["positive_rate"]),
                bayes_auc=none_to_nan(data["bayes_auc"]),
                bayes_auc_train=none_to_nan(data["bayes_auc_train"]),
                cardinalities=tuple(int(c) for c in data["cardinalities"]),
                drift_columns=tuple(str(c) for c in data.get("drift_columns", ())),
            )


def read_report(out_dir: str | os.PathLike[str]) -> SynthReport:
    """Read the report :func:`synth_criteo` wrote to ``out_dir/synth.json``.

    Args:
        out_dir: the directory passed to :func:`synth_criteo`.

    Returns:
        The report.

    Raises:
        FileNotFoundError: there is no ``synth.json`` (generation never finished).
        ValueError: ``synth.json`` is not a valid report.
    """
    return SynthReport.from_json(read_document(out_dir, "criteo"))

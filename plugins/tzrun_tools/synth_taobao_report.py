"""The report :func:`tzrun_tools.synth_taobao.synth_taobao` writes next to its data
(``synth.json``) and reads back."""

from __future__ import annotations

import os
from typing import Any

import attrs

from tzrun_tools.synth_common import nan_to_none, none_to_nan, read_document, report_fields

__all__ = ["TaobaoSynthReport", "read_taobao_report"]


@attrs.frozen
class TaobaoSynthReport:
    """What :func:`synth_taobao` wrote, and the best AUC of each label on it.

    Attributes:
        out_dir: the directory holding ``train/``, ``eval/`` and ``synth.json``.
        train_rows: rows in ``train/``.
        eval_rows: rows in ``eval/``.
        seed: the seed the data and the ground-truth model were drawn from.
        click_rate: the fraction of ``click`` 1 in the train split.
        buy_rate: the fraction of ``buy`` 1 in the train split.
        bayes_auc: per label, the AUC of its true probability on the eval split (NaN when the
            split holds a single class).
        bayes_auc_train: the same on the train split.
    """

    out_dir: str
    train_rows: int
    eval_rows: int
    seed: int
    click_rate: float
    buy_rate: float
    bayes_auc: dict[str, float]
    bayes_auc_train: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        """Return the report as a JSON-serializable dict (NaN AUCs become None)."""
        return {
            "out_dir": self.out_dir,
            "train_rows": self.train_rows,
            "eval_rows": self.eval_rows,
            "seed": self.seed,
            "click_rate": self.click_rate,
            "buy_rate": self.buy_rate,
            "bayes_auc": nan_to_none(self.bayes_auc),
            "bayes_auc_train": nan_to_none(self.bayes_auc_train),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaobaoSynthReport:
        """Build a report from :meth:`to_json` output; unknown keys are ignored.

        Raises:
            ValueError: a field is missing.
        """
        with report_fields("taobao"):
            return cls(
                out_dir=str(data["out_dir"]),
                train_rows=int(data["train_rows"]),
                eval_rows=int(data["eval_rows"]),
                seed=int(data["seed"]),
                click_rate=float(data["click_rate"]),
                buy_rate=float(data["buy_rate"]),
                bayes_auc=none_to_nan(data["bayes_auc"]),
                bayes_auc_train=none_to_nan(data["bayes_auc_train"]),
            )


def read_taobao_report(out_dir: str | os.PathLike[str]) -> TaobaoSynthReport:
    """Read the report :func:`synth_taobao` wrote to ``out_dir/synth.json``.

    Raises:
        FileNotFoundError: there is no ``synth.json`` (generation never finished).
        ValueError: ``synth.json`` is not a valid report.
    """
    return TaobaoSynthReport.from_json(read_document(out_dir, "taobao"))

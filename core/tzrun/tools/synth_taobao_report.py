"""The report :func:`tzrun.tools.synth_taobao.synth_taobao` writes next to its data
(``synth.json``) and reads back."""

from __future__ import annotations

import math
import os
from typing import Any

import attrs

from tzrun.tools.synth_common import read_document

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
        def clean(values: dict[str, float]) -> dict[str, float | None]:
            return {k: None if math.isnan(v) else float(v) for k, v in values.items()}

        return {
            "out_dir": self.out_dir,
            "train_rows": self.train_rows,
            "eval_rows": self.eval_rows,
            "seed": self.seed,
            "click_rate": self.click_rate,
            "buy_rate": self.buy_rate,
            "bayes_auc": clean(self.bayes_auc),
            "bayes_auc_train": clean(self.bayes_auc_train),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaobaoSynthReport:
        """Build a report from :meth:`to_json` output; unknown keys are ignored.

        Raises:
            ValueError: a field is missing.
        """
        def auc(values: dict[str, Any]) -> dict[str, float]:
            return {k: float("nan") if v is None else float(v) for k, v in values.items()}

        try:
            return cls(
                out_dir=str(data["out_dir"]),
                train_rows=int(data["train_rows"]),
                eval_rows=int(data["eval_rows"]),
                seed=int(data["seed"]),
                click_rate=float(data["click_rate"]),
                buy_rate=float(data["buy_rate"]),
                bayes_auc=auc(data["bayes_auc"]),
                bayes_auc_train=auc(data["bayes_auc_train"]),
            )
        except KeyError as e:
            raise ValueError(
                f"synthetic data report is missing the field {e.args[0]!r}; regenerate it with "
                "`tzrec-run data synth taobao`"
            ) from None


def read_taobao_report(out_dir: str | os.PathLike[str]) -> TaobaoSynthReport:
    """Read the report :func:`synth_taobao` wrote to ``out_dir/synth.json``.

    Raises:
        FileNotFoundError: there is no ``synth.json`` (generation never finished).
        ValueError: ``synth.json`` is not a valid report.
    """
    return TaobaoSynthReport.from_json(read_document(out_dir, "taobao"))

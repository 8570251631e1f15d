"""``tzrec-run convert``: a TorchEasyRec pipeline config as tzrec-run TOML.

TorchEasyRec configs are protobuf text format, and its ``.proto`` files are not installed here,
so :func:`parse_text_proto` reads the text without a schema: every message becomes a dict from
field name to the list of its values, in file order (a field given once is a list of one).
Scalars are ``int``, ``float``, ``str`` (quoted strings) and :class:`Identifier` (bare words:
enum values, ``true``/``false``).

:func:`convert_pipeline_config` maps ``train_config``, ``eval_config``, the training keys of
``data_config`` and ``export_config``, every ``metrics``, ``losses`` and ``train_metrics`` of
``model_config`` (task towers included), ``feature_configs`` (id, raw, lookup and sequence
features; sequence groups as ``[[features.sequence]]``) and the model (``deepfm``,
``wide_and_deep``, ``dlrm``, ``mmoe``, ``ple``, ``dbmtl``, ``dssm``, ``multi_tower``, ``multi_tower_din`` as ``din``) to tzrec-run keys. Every field it reads is marked; a field it cannot translate, or does not know, is reported
with its protobuf path, never dropped, and a feature or model that does not map leaves a
commented placeholder with the reason. TorchEasyRec defaults that change results and differ from
tzrec-run's (the dense SGD momentum of 0.9, checkpoints every 1000 steps, DLRM's
``arch_with_sparse``, DSSM's similarity and temperature, ...) are written out. See
docs/migration.md.

Modules: :mod:`~tzrun_tools.convert.prototext` (the parser), :mod:`~tzrun_tools.convert.nodes` (a message
being converted, and the findings), :mod:`~tzrun_tools.convert.optimizers`, :mod:`~tzrun_tools.convert.train`,
:mod:`~tzrun_tools.convert.evaluation` (losses, metrics, ``eval_config``, ``export_config``),
:mod:`~tzrun_tools.convert.data`, :mod:`~tzrun_tools.convert.groups` (feature groups and sequence encoders),
:mod:`~tzrun_tools.convert.sequences` (sequence groups),
:mod:`~tzrun_tools.convert.features`, :mod:`~tzrun_tools.convert.models` and :mod:`~tzrun_tools.convert.pipeline`
(the whole config and its TOML).
"""

from __future__ import annotations

from tzrun_tools.convert.nodes import Finding
from tzrun_tools.convert.pipeline import Conversion, convert_file, convert_pipeline_config, summary_lines
from tzrun_tools.convert.prototext import Identifier, parse_text_proto
from tzrun.errors import ProtoTextError

__all__ = [
    "Identifier",
    "ProtoTextError",
    "Finding",
    "Conversion",
    "parse_text_proto",
    "convert_pipeline_config",
    "convert_file",
    "summary_lines",
]

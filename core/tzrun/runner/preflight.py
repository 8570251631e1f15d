"""The checks that need the whole config and the registries, run by ``tzrec-run check`` and
before every training run (the config passes check each section on its own)."""

from __future__ import annotations

from typing import Sequence

from tzrun.config.schema import RunConfig
from tzrun.conformance import config_conformance_problems
from tzrun.data.features import feature_specs
from tzrun.data.sampling import SAMPLED_OUTPUT
from tzrun.errors import ConfigError, ConfigProblem, did_you_mean
from tzrun.registry import Registries
from tzrun.runner.retention import check_best_metric, eval_result_keys
from tzrun.runner.slots import input_columns, loss_slots, metric_slots

__all__ = ["preflight"]


def preflight(cfg: RunConfig, registries: Registries, source: str) -> None:
    """Check what no single section can:

    * every loss and metric reads an output the model makes (a model declares its outputs with
      ``register(..., outputs=fn)``, ``fn(model_cfg)`` returning their names);
    * ``eval.best_metric`` names an eval result;
    * each stage's own ``check`` (``register(..., check=fn)``, see
      :func:`tzrun.hookspecs.tzrun_register_stages`);
    * the reader's own ``check`` of the columns the run reads (see
      :func:`tzrun.hookspecs.tzrun_register_readers`);
    * the loss weighting's own ``check`` of the loss names (see
      :func:`tzrun.hookspecs.tzrun_register_loss_weightings`);
    * every named component's conformance on a tiny synthetic input
      (:mod:`tzrun.conformance`).

    Raises:
        ConfigError: with every problem found, each at its TOML path.
    """
    problems = _output_problems(cfg, registries)
    try:
        check_best_metric(cfg, registries, source)
    except ConfigError as error:
        problems.extend(error.problems)
    keys: list[str] | None = None
    for i, component in enumerate(cfg.train.stages):
        check = registries["stage"].get(component.type, f"train.stages[{i}].type").extras.get("check")
        if check is None:
            continue
        if keys is None:
            keys = eval_result_keys(cfg, registries) if cfg.data.eval_input is not None else []
        for key, message in check(component.config, cfg, keys):
            problems.append(ConfigProblem(f"train.stages[{i}].{key}" if key else f"train.stages[{i}]", message))
    problems.extend(_reader_problems(cfg, registries))
    problems.extend(_loss_weighting_problems(cfg, registries))
    problems.extend(_sampler_problems(cfg, registries))
    problems.extend(ConfigProblem(path, message) for path, message in config_conformance_problems(cfg, registries))
    if problems:
        raise ConfigError(source, problems)


def _sampler_problems(cfg: RunConfig, registries: Registries) -> list[ConfigProblem]:
    """What ``check`` reports about ``[data.sampler]`` (the sampler's own options are checked
    with the config): a sampler for a model that declares no :data:`SAMPLED_OUTPUT` output, or
    a loss or metric that reads it without a sampler."""
    declare = registries["model"].get(cfg.model.type, "model.type").extras.get("outputs")
    if cfg.data.sampler is not None:
        if declare is not None and SAMPLED_OUTPUT not in declare(cfg.model.config):
            return [ConfigProblem("data.sampler", f"model {cfg.model.type} does not use sampled negatives (it makes no "
                                                  f"'{SAMPLED_OUTPUT}' output); remove [data.sampler] or use a two-tower model")]
        return []
    reads = [(f"losses[{i}]", s.prediction) for i, s in enumerate(loss_slots(cfg, registries))]
    for what in ("metrics", "train_metrics"):
        reads += [(f"{what}[{i}]", s.prediction) for i, s in enumerate(metric_slots(cfg, registries, what))]
    return [ConfigProblem(path, f"reads '{SAMPLED_OUTPUT}', which needs sampled negatives: add [data.sampler] "
                                "(tzrec-run help retrieval)") for path, read in reads if read == SAMPLED_OUTPUT]


def _reader_problems(cfg: RunConfig, registries: Registries) -> list[ConfigProblem]:
    check = registries["reader"].get(cfg.data.reader.type, "data.reader.type").extras.get("check")
    if check is None:
        return []
    columns = input_columns(cfg, feature_specs(cfg.features))
    return [ConfigProblem(f"data.reader.{key}" if key else "data.reader", message)
            for key, message in check(cfg.data.reader.config, columns)]


def _loss_weighting_problems(cfg: RunConfig, registries: Registries) -> list[ConfigProblem]:
    component = cfg.train.loss_weighting
    check = registries["loss_weighting"].get(component.type, "train.loss_weighting.type").extras.get("check")
    if check is None:
        return []
    names = [slot.name for slot in loss_slots(cfg, registries)]
    return [ConfigProblem(f"train.loss_weighting.{key}" if key else "train.loss_weighting", message)
            for key, message in check(component.config, names)]


def _output_problems(cfg: RunConfig, registries: Registries) -> list[ConfigProblem]:
    declare = registries["model"].get(cfg.model.type, "model.type").extras.get("outputs")
    if declare is None:
        return []
    outputs: Sequence[str] = list(declare(cfg.model.config))
    problems = []
    for what, slots, kind in (("losses", loss_slots(cfg, registries), "loss"),
                              ("metrics", metric_slots(cfg, registries), "metric"),
                              ("train_metrics", metric_slots(cfg, registries, "train_metrics"), "metric")):
        components = getattr(cfg, what)
        for i, (slot, component) in enumerate(zip(slots, components)):
            if slot.prediction in outputs:
                continue
            explicit = component.fields.prediction is not None
            where = f"{what}[{i}].prediction" if explicit else f"{what}[{i}]"
            how = "" if explicit else f" (the default of {kind} '{component.type}')"
            guess = did_you_mean(slot.prediction, outputs) if explicit else None
            hint = f"; did you mean '{guess}'?" if guess else ""
            problems.append(ConfigProblem(where, (
                f"reads the model output '{slot.prediction}'{how}, but {cfg.model.type} outputs "
                f"{', '.join(outputs)}; set prediction = \"...\"{hint}")))
    return problems

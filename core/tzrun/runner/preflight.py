"""The checks that need the whole config and the registries, run by ``tzrec-run check`` and
before every training run (the config passes check each section on its own)."""

from __future__ import annotations

from typing import Collection, Sequence

from tzrun.config.sequences import appended_item_problems
from tzrun.kernel.conformance import config_conformance_problems
from tzrun.data.sampling import SAMPLED_OUTPUT
from tzrun.errors import ConfigError, ConfigProblem, did_you_mean
from tzrun.runner.facts import RunFacts
from tzrun.runner.retention import check_best_metric

__all__ = ["preflight"]


def preflight(facts: RunFacts, source: str, probes: Collection[str] | None = None) -> None:
    """Check what no single section can, from the run's facts (the slots, the input columns
    and the eval result keys the run itself uses):

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
      (:mod:`tzrun.kernel.conformance`), of the kinds in ``probes`` when given.

    Args:
        facts: the run's derived facts (:attr:`tzrun.runner.session.Session.facts`).
        source: the config's file, named in the error.
        probes: the component kinds the command builds (None: every kind); a command that
            builds none (``predict --export``) skips the probes and the imports they need.

    Raises:
        ConfigError: with every problem found, each at its TOML path.
    """
    cfg, registries = facts.cfg, facts.registries
    problems = _output_problems(facts)
    try:
        check_best_metric(facts, source)
    except ConfigError as error:
        problems.extend(error.problems)
    problems.extend(_stage_problems(facts))
    problems.extend(_reader_problems(facts))
    problems.extend(_loss_weighting_problems(facts))
    problems.extend(_sampler_problems(facts))
    problems.extend(ConfigProblem(path, message) for path, message in config_conformance_problems(cfg, registries, probes))
    if problems:
        raise ConfigError(source, problems)


def _stage_problems(facts: RunFacts) -> list[ConfigProblem]:
    """Each stage's own ``check`` of its options, the config and the eval result keys."""
    cfg, problems = facts.cfg, []
    for i, component in enumerate(cfg.train.stages):
        check = facts.registries["stage"].get(component.type, f"train.stages[{i}].type").extras.get("check")
        if check is None:
            continue
        keys = facts.eval_result_keys if cfg.data.eval_input is not None else []
        where = component.section or f"train.stages[{i}]"
        for key, message in check(component.config, cfg, keys):
            problems.append(ConfigProblem(f"{where}.{key}" if key else where, message))
    return problems


def _sampler_problems(facts: RunFacts) -> list[ConfigProblem]:
    """What ``check`` reports about ``[data.sampler]`` (the sampler's own options are checked
    with the config): a sampler for a model that declares no :data:`SAMPLED_OUTPUT` output, or
    a loss or metric that reads it without a sampler, and features a sampler that appends items
    cannot feed; and the sampler's own ``check`` (``register(..., check=fn)``). A sampler that
    expands rows (``expands_rows=True``) fits every model."""
    cfg, registries = facts.cfg, facts.registries
    declare = registries["model"].get(cfg.model.type, "model.type").extras.get("outputs")
    if cfg.data.sampler is not None:
        entry = registries["sampler"].get(cfg.data.sampler.type, "data.sampler.type")
        check = entry.extras.get("check")
        own = [ConfigProblem(f"data.sampler.{key}" if key else "data.sampler", message)
               for key, message in (check(cfg.data.sampler.config) if check is not None else ())]
        if entry.extras.get("expands_rows"):
            return own
        if declare is not None and SAMPLED_OUTPUT not in declare(cfg.model.config):
            return own + [ConfigProblem("data.sampler", f"model {cfg.model.type} does not use sampled negatives (it makes "
                                                        f"no '{SAMPLED_OUTPUT}' output); remove [data.sampler] or use a "
                                                        "two-tower model")]
        return own + appended_item_problems(cfg.features)
    reads = [(f"{what}[{i}]", s.prediction) for what in ("losses", "metrics", "train_metrics")
             for i, s in enumerate(facts.slots(what))]
    return [ConfigProblem(path, f"reads '{SAMPLED_OUTPUT}', which needs sampled negatives: add [data.sampler] "
                                "(tzrec-run help retrieval)") for path, read in reads if read == SAMPLED_OUTPUT]


def _reader_problems(facts: RunFacts) -> list[ConfigProblem]:
    reader = facts.cfg.data.reader
    check = facts.registries["reader"].get(reader.type, "data.reader.type").extras.get("check")
    if check is None:
        return []
    return [ConfigProblem(f"data.reader.{key}" if key else "data.reader", message)
            for key, message in check(reader.config, facts.input_columns)]


def _loss_weighting_problems(facts: RunFacts) -> list[ConfigProblem]:
    component = facts.cfg.train.loss_weighting
    check = facts.registries["loss_weighting"].get(component.type, "train.loss_weighting.type").extras.get("check")
    if check is None:
        return []
    names = [slot.name for slot in facts.loss_slots]
    return [ConfigProblem(f"train.loss_weighting.{key}" if key else "train.loss_weighting", message)
            for key, message in check(component.config, names)]


def _output_problems(facts: RunFacts) -> list[ConfigProblem]:
    cfg = facts.cfg
    declare = facts.registries["model"].get(cfg.model.type, "model.type").extras.get("outputs")
    if declare is None:
        return []
    outputs: Sequence[str] = list(declare(cfg.model.config))
    problems = []
    for what, kind in (("losses", "loss"), ("metrics", "metric"), ("train_metrics", "metric")):
        components = getattr(cfg, what)
        for i, (slot, component) in enumerate(zip(facts.slots(what), components)):
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
    return problems + _kind_problems(facts, outputs)


def _kind_problems(facts: RunFacts, outputs: Sequence[str]) -> list[ConfigProblem]:
    """A loss registered with ``reads=KIND`` reading a declared output of another kind (the
    head of its name, before ``/``)."""
    problems = []
    for i, (slot, component) in enumerate(zip(facts.loss_slots, facts.cfg.losses)):
        kind = facts.registries["loss"].get(component.type, f"losses[{i}].type").extras.get("reads")
        if kind is None or slot.prediction not in outputs or slot.prediction.split("/", 1)[0] == kind:
            continue
        fitting = [o for o in outputs if o.split("/", 1)[0] == kind]
        fix = (f"set prediction to one of {', '.join(fitting)}" if fitting else
               f"{facts.cfg.model.type} as configured outputs no {kind}: see its options (tzrec-run help models)")
        problems.append(ConfigProblem(f"losses[{i}].prediction", (
            f"loss '{component.type}' reads {kind} outputs, but '{slot.prediction}' is another kind; {fix}")))
    return problems

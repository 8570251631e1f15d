"""``tzrec-run export``: a checkpoint -> a directory a serving system loads with torch alone.

The model is rebuilt on one process, on the CPU, without a process group and unsharded; its
weights are read from the checkpoint through ``torch.distributed.checkpoint`` (which reshards,
so a checkpoint of any number of ranks loads); its embedding collections become plain torch
(:mod:`tzrun_serving.plain`), a ``zch`` table's with its id-to-row map in front of its
lookup (docs/zch.md, Export); then each of its serving programs is traced by ``torch.export``
with a dynamic batch dimension and a dynamic id count per feature, and saved with
``torch.export.save``. Layout of an export::

    <out>/<program>.pt2     one torch.export program per serving program ("model"; a
                            retrieval model's "user_tower" and "item_tower")
    <out>/manifest.json     inputs, their dtypes and transforms, outputs, the checkpoint
    <out>/COMPLETE          written last: without it the directory is not an export

A model chooses its serving programs with an attribute ``serving_programs``: ``{name:
{"outputs": [...], "features": [...]}}`` (the features a program reads; the others are fed as
empty inside it). Without it there is one program, ``"model"``, of every output and feature. A model with a method
``serving_model()`` has the module it returns traced in its place (the same ``forward(batch)``,
its own modules shared, not copied): a model that serves a part of itself, as
``rocket_launching``'s light net, exports that part's weights alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs
import torch
from torch import nn

from tzrun import ModelContext, as_path, is_remote, write_atomic
from tzrun.checkpoints import CheckpointView, find_checkpoint, open_checkpoint
from tzrun.errors import CheckpointError, TzrunError
from tzrun_serving.manifest import COMPLETE, FORMAT, MANIFEST, dense_groups, manifest_of, sequence_keys
from tzrun_serving.plain import PlainFeatures, PlainSequenceFeatures, plain_batch, swap_embedding_collections

__all__ = ["ServingProgram", "ServingModule", "load_unsharded", "serving_programs", "export_model",
           "write_export", "export_checkpoint", "ExportResult", "claim_export_dir", "is_export_file", "is_legacy_export"]

log = logging.getLogger("tzrun")


@attrs.frozen
class ServingProgram:
    """One program of an export.

    Attributes:
        name: its file is ``<name>.pt2``.
        outputs: the model outputs it returns.
        features: the features (dense, id and sequence groups) it reads; the others are not
            its inputs.
        shapes: each output's shape in the exported program (``"batch"`` for the batch
            dimension, ``"dynamic"`` for another symbolic one), once exported.
    """

    name: str
    outputs: tuple[str, ...]
    features: tuple[str, ...]
    shapes: tuple[tuple[str, tuple[int | str, ...]], ...] = ()


@attrs.frozen
class ExportResult:
    """What :func:`export_checkpoint` wrote.

    Attributes:
        path: the export directory.
        checkpoint: the checkpoint it came from.
        step: that checkpoint's step.
        programs: the programs written.
    """

    path: Path
    checkpoint: Path
    step: int
    programs: tuple[ServingProgram, ...]


class ServingModule(nn.Module):
    """The exported function: the program's input tensors (see :mod:`tzrun_serving.manifest`)
    -> the model's outputs. Builds a :class:`~tzrun.data.batch.Batch` of them and calls the
    model's own forward; the features the program does not read are fed as zeros (dense) and
    rows without ids (pooled and unpooled).

    Args:
        model: the user's model, its embedding collections plain already.
        specs: the run's feature specs.
        program: which outputs and features.
    """

    dense_index: torch.Tensor
    sparse_index: torch.Tensor
    sequence_index: torch.Tensor

    def __init__(self, model: nn.Module, specs: Any, program: ServingProgram) -> None:
        super().__init__()
        self.model = model
        used = set(program.features)
        self.num_dense = len(specs.dense)
        self.sparse = [f.name for f in specs.pooled]
        self.sequence = _all_sequence_keys(specs)
        self.fed = sequence_keys(specs, program.features)
        fed_dense = {g.name for g in dense_groups(specs, program.features)}
        self.dense_groups = [(g.name, g.max_len, len(g.dense), g.name in fed_dense) for g in specs.sequence_groups if g.dense]
        self.weighted = any(t.weighted for t in specs.tables)
        dense = [i for i, f in enumerate(specs.dense) if f.name in used]
        sparse = [i for i, f in enumerate(specs.pooled) if f.name in used]
        fed = set(self.fed)
        sequence = [i for i, k in enumerate(self.sequence) if k in fed]
        self.has_dense, self.all_sparse = bool(dense), len(sparse) == len(self.sparse)
        self.register_buffer("dense_index", torch.tensor(dense, dtype=torch.int64), persistent=False)
        self.register_buffer("sparse_index", torch.tensor(sparse, dtype=torch.int64), persistent=False)
        self.register_buffer("sequence_index", torch.tensor(sequence, dtype=torch.int64), persistent=False)
        self.program = program

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        outputs = self.model(self.batch(inputs))
        return {name: outputs[name].float() for name in self.program.outputs}

    def batch(self, inputs: dict[str, torch.Tensor]) -> Any:
        """The :class:`~tzrun.data.batch.Batch` the model receives for ``inputs``."""
        lengths = inputs["lengths"]
        rows = lengths.shape[1]
        dense = torch.zeros(rows, self.num_dense)
        if self.has_dense:
            dense = dense.index_copy(1, self.dense_index, inputs["dense"])
        if not self.all_sparse:
            lengths = torch.zeros(len(self.sparse), rows, dtype=torch.int64).index_copy(0, self.sparse_index, lengths)
        weights = inputs["weights"] if self.weighted else None
        sparse = PlainFeatures(self.sparse, inputs["ids"], lengths, weights)
        sequence_dense = {name: inputs[f"sequence_dense/{name}"] if fed else torch.zeros(rows, max_len, k)
                          for name, max_len, k, fed in self.dense_groups}
        return plain_batch(dense, sparse, self.sequence_features(inputs, rows), sequence_dense)

    def sequence_features(self, inputs: dict[str, torch.Tensor], rows: Any) -> PlainSequenceFeatures:
        """``batch.sequence``: the program's unpooled keys from ``inputs``, the others empty."""
        lengths = torch.zeros(len(self.sequence), rows, dtype=torch.int64)
        if self.fed:
            lengths = lengths.index_copy(0, self.sequence_index, inputs["sequence_lengths"])
        empty = torch.zeros(0, dtype=torch.int64)
        ids = {k: inputs[f"sequence_ids/{k}"] if k in self.fed else empty for k in self.sequence}
        return PlainSequenceFeatures(self.sequence, ids, lengths)


def _all_sequence_keys(specs: Any) -> list[str]:
    """Every key of ``batch.sequence``, in the batch builder's order."""
    return sequence_keys(specs, [g.name for g in specs.sequence_groups] + [f.name for f in specs.unpooled])


def _feature_names(specs: Any) -> tuple[str, ...]:
    """Every feature a program may read: dense, sparse, then sequence groups."""
    return (tuple(f.name for f in specs.dense) + tuple(f.name for f in specs.sparse)
            + tuple(g.name for g in specs.sequence_groups))


def serving_programs(model: nn.Module, outputs: Sequence[str], specs: Any) -> list[ServingProgram]:
    """The programs ``model`` declares (its ``serving_programs`` attribute), or one ``"model"``
    program of every output and feature.

    Raises:
        TzrunError: when a declared program names an unknown output or feature.
    """
    features = _feature_names(specs)
    declared = getattr(model, "serving_programs", None)
    if not declared:
        return [ServingProgram("model", tuple(outputs), features)]
    programs = []
    for name, spec in declared.items():
        unknown = [o for o in spec["outputs"] if o not in outputs] + [f for f in spec["features"] if f not in features]
        if unknown:
            raise TzrunError(f"{type(model).__name__}.serving_programs[{name!r}] names {', '.join(unknown)}, "
                             f"which the model does not have (outputs: {', '.join(outputs)})")
        wanted = set(spec["features"])
        programs.append(ServingProgram(name, tuple(spec["outputs"]), tuple(f for f in features if f in wanted)))
    return programs


def load_unsharded(facts: Any, checkpoint: CheckpointView) -> nn.Module:
    """The user's model built on the CPU, unsharded, with the checkpoint's weights (the EMA
    averages where evaluation uses them), in eval mode. Needs no process group.

    Raises:
        CheckpointError: when the checkpoint does not hold the model's tensors, or their shapes differ.
    """
    cfg, specs = facts.cfg, facts.specs
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, torch.device("cpu"), tuple(cfg.data.labels),
                       specs.sequence_groups, specs.sequence_tables)
    model: nn.Module = facts.registries["model"].get(cfg.model.type, "model.type").build(cfg.model.config, ctx)
    state = model.state_dict()
    saved = checkpoint.tensor_shapes()
    keys = checkpoint.model_keys(model, cfg)
    problems = [f"'{k}' is not in it" for k in state if keys[k] not in saved]
    problems += [f"'{k}' has shape {list(saved[keys[k]])} there and {list(v.shape)} here"
                 for k, v in state.items() if keys[k] in saved and tuple(saved[keys[k]]) != tuple(v.shape)]
    if problems:
        raise CheckpointError(f"{checkpoint.path}: does not hold this config's model: " + "; ".join(problems[:6])
                              + ". Export it with the config it was trained with (its config is in meta.json)")
    checkpoint.load_state({keys[k]: v for k, v in state.items()})
    model.load_state_dict(state)
    ema = cfg.train.dense_optimizer.fields.ema
    if ema is not None and ema.use_for_eval:
        update = checkpoint.load_value("update")
        averages = (update.get("ema") or {}).get("averages")
        if not averages:
            raise CheckpointError(f"{checkpoint.path} holds no EMA averages, but the config evaluates with them "
                                  "(train.dense_optimizer.ema.use_for_eval); remove the ema option to export its weights")
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in averages.items():
                params[name.removeprefix("model.")].copy_(value)
    model.eval()
    return model


def _example_inputs(specs: Any, program: ServingProgram, rows: int = 3) -> dict[str, torch.Tensor]:
    """Inputs to trace with: ``rows`` rows, ids in range (sizes of 0 and 1 are avoided:
    torch.export would specialize on them)."""
    generator = torch.Generator().manual_seed(0)
    used = set(program.features)
    sparse = [f for f in specs.pooled if f.name in used]
    lengths = torch.tensor([[2] + [1] * (rows - 2) + [0] for _ in sparse], dtype=torch.int64).view(len(sparse), rows)
    ids = torch.cat([torch.randint(0, f.num_embeddings, (rows,), generator=generator) for f in sparse]
                    or [torch.zeros(0, dtype=torch.int64)])
    inputs = {}
    dense = [f for f in specs.dense if f.name in used]
    if dense:
        inputs["dense"] = torch.rand(rows, len(dense), generator=generator)
    inputs["ids"] = ids
    inputs["lengths"] = lengths
    if any(t.weighted for t in specs.tables):
        inputs["weights"] = torch.rand(ids.shape[0], generator=generator)
    keys = sequence_keys(specs, program.features)
    if keys:
        sizes = _sequence_sizes(specs)
        inputs["sequence_lengths"] = torch.tensor([[min(3, sizes[k][1])] + [1] * (rows - 2) + [0] for k in keys],
                                                  dtype=torch.int64)
        for k, row in zip(keys, inputs["sequence_lengths"]):
            inputs[f"sequence_ids/{k}"] = torch.randint(0, sizes[k][0], (int(row.sum()),), generator=generator)
    for g in dense_groups(specs, program.features):
        inputs[f"sequence_dense/{g.name}"] = torch.rand(rows, g.max_len, len(g.dense), generator=generator)
    return inputs


def _sequence_sizes(specs: Any) -> dict[str, tuple[int, int]]:
    """Each unpooled key -> (its ids' range, the most ids a row has: its group's ``max_len``)."""
    sizes = {f.name: (f.num_embeddings, 2**31 - 2) for f in specs.unpooled}
    sizes.update({f.name: (f.num_embeddings, g.max_len) for g in specs.sequence_groups for f in g.features})
    return sizes


def _dynamic_shapes(inputs: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    from torch.export import Dim

    batch = Dim("batch", min=1, max=2**31 - 2)
    ids = Dim("ids", min=0, max=2**31 - 2)
    # a program without pooled id features (a DIN whose id features are all its group's
    # queries) always gets no ids: its id count is the constant 0, not a dimension
    pooled = inputs["lengths"].shape[0] > 0
    axes: dict[str, Any] = {"dense": {0: batch}, "ids": {0: ids} if pooled else None, "lengths": {1: batch},
                            "weights": {0: ids} if pooled else None, "sequence_lengths": {1: batch}}
    for i, name in enumerate(n for n in inputs if n.startswith("sequence_ids/")):
        axes[name] = {0: Dim(f"sequence_ids_{i}", min=0, max=2**31 - 2)}
    axes.update({name: {0: batch} for name in inputs if name.startswith("sequence_dense/")})
    return {"inputs": {name: axes[name] for name in inputs}}


def export_model(model: nn.Module, specs: Any, outputs: Sequence[str],
                 remaps: Mapping[tuple[str, str], nn.Module] | None = None) -> dict[ServingProgram, Any]:
    """Swap ``model``'s embedding collections for plain torch and ``torch.export`` each of its
    serving programs. Returns ``{program: ExportedProgram}``.

    Args:
        model: the user's model, unsharded, with its weights.
        specs: the run's feature specs.
        outputs: the outputs the model declares (empty: what its forward returns).
        remaps: ``(collection, table) -> id-to-row map`` of each ``zch`` table
            (:meth:`tzrun.CheckpointView.zch_remaps`), traced into the programs in front of
            the table's lookup.
    """
    swap_embedding_collections(model, [f.name for f in specs.pooled], _all_sequence_keys(specs), remaps or {})
    model.eval()
    if not outputs:  # the model declares none: what its forward returns
        everything = ServingProgram("model", (), _feature_names(specs))
        with torch.no_grad():
            outputs = list(model(ServingModule(model, specs, everything).batch(_example_inputs(specs, everything))))
    programs = serving_programs(model, outputs, specs)
    serving_model = getattr(model, "serving_model", None)
    served: nn.Module = serving_model() if callable(serving_model) else model
    exported = {}
    for program in programs:
        module = ServingModule(served, specs, program).eval()
        inputs = _example_inputs(specs, program)
        with torch.no_grad():
            ep = torch.export.export(module, (inputs,), dynamic_shapes=_dynamic_shapes(inputs), strict=False)
        exported[attrs.evolve(program, shapes=_output_shapes(ep, list(inputs)))] = ep
    return exported


def _output_shapes(ep: Any, inputs: Sequence[str]) -> tuple[tuple[str, tuple[int | str, ...]], ...]:
    """Each user output of ``ep`` (a dict of tensors) and its shape: ``"batch"`` where it is
    the batch dimension (that of the ``lengths`` input), ``"dynamic"`` for another symbolic
    size, else the size."""
    from torch.export.graph_signature import InputKind, OutputKind

    nodes = {n.name: n for n in ep.graph.nodes}
    user_inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    batch = str(nodes[user_inputs[list(inputs).index("lengths")]].meta["val"].shape[1])
    returned = next(n for n in ep.graph.nodes if n.op == "output").args[0]
    values = [a for a, s in zip(returned, ep.graph_signature.output_specs) if s.kind == OutputKind.USER_OUTPUT]
    names = ep.module_call_graph[0].signature.out_spec.context

    def size(d: Any) -> int | str:
        if str(d) == batch:
            return "batch"
        return int(d) if str(d).isdigit() else "dynamic"

    return tuple((name, tuple(size(d) for d in v.meta["val"].shape)) for name, v in zip(names, values))


def is_export_file(name: str) -> bool:
    """Whether ``name`` is one an export writes: its programs, manifest and marker (and their
    temporary files)."""
    name = name.removeprefix(".").removesuffix(".tmp")
    return name in (MANIFEST, COMPLETE) or name.endswith(".pt2")


def is_legacy_export(path: Path) -> bool:
    """Whether ``path`` is an export written before exports carried an output marker."""
    try:
        marker = json.loads((as_path(path) / COMPLETE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format") == FORMAT


def claim_export_dir(out: Path, run_id: str = "") -> None:
    """Make ``out`` an empty export directory with its marker (see :mod:`tzrun.io.owned`): an
    export of ours (or one written before markers) is replaced, file by file; anything else is
    refused.

    Raises:
        WriteError: naming ``out``, what it holds and the fix.
    """
    from tzrun.outputs import claim_output_dir, output_entries, read_output_marker, remove_owned

    names = output_entries(out)
    if names and read_output_marker(out) is None and is_legacy_export(out) and all(is_export_file(n) for n in names):
        remove_owned(out, names)  # an export of an earlier version: ours, without the marker
    claim_output_dir(out, "export", is_export_file, flag="--out", run_id=run_id)


def write_export(out: Path, exported: Mapping[ServingProgram, Any], manifest: Mapping[str, Any]) -> Path:
    """Write the programs, then the manifest, then (last) the completion marker into ``out``
    (local or an object store), once :func:`claim_export_dir` made it ours and empty.

    Raises:
        WriteError: when ``out`` is a file, or a directory that is not an export of ours.
    """
    out = as_path(out)
    claim_export_dir(out, str((manifest.get("checkpoint") or {}).get("run_id") or ""))
    for program, ep in exported.items():
        target = out / f"{program.name}.pt2"
        if is_remote(target):
            import io

            buffer = io.BytesIO()
            torch.export.save(ep, buffer)
            with target.open("wb") as f:
                f.write(buffer.getvalue())
        else:
            torch.export.save(ep, str(target))
    files = {f"{p.name}.pt2": hashlib.sha256((out / f"{p.name}.pt2").read_bytes()).hexdigest() for p in exported}
    body = json.dumps({**manifest, "files": files}, indent=2).encode()
    write_atomic(out / MANIFEST, body)
    write_atomic(out / COMPLETE, json.dumps({"format": FORMAT, "manifest_sha256": hashlib.sha256(body).hexdigest()}).encode())
    return out


def export_checkpoint(facts: Any, checkpoint: Path | CheckpointView, out: Path) -> ExportResult:
    """Export the complete checkpoint ``checkpoint`` into ``out`` on this process alone (no
    GPU, no collective: in training only rank 0 calls it). The checkpoint is checked against
    its manifest first.

    Raises:
        CheckpointError: for a damaged checkpoint or one of another model.
    """
    view = checkpoint if isinstance(checkpoint, CheckpointView) else open_checkpoint(checkpoint)
    view.verify(state_while_reading=True)  # alone (in training, the other ranks are not here); state/ as it is read
    model = load_unsharded(facts, view)
    remaps = view.zch_remaps(model, facts.cfg)
    entry = facts.registries["model"].get(facts.cfg.model.type, "model.type")
    declare = entry.extras.get("outputs")
    outputs = list(declare(facts.cfg.model.config)) if declare is not None else []
    exported = export_model(model, facts.specs, outputs, remaps)
    source = {"path": str(view.path), "step": view.step, "marker_sha256": view.marker_sha256(),
              "world_size": view.meta.get("world_size"), "run_id": view.meta.get("run_id")}
    manifest = manifest_of(facts, list(exported), source)
    path = write_export(out, exported, manifest)
    return ExportResult(path, as_path(view.path), view.step, tuple(exported))


def export_command(session: Any, which: str, out: str | Path) -> ExportResult:
    """``tzrec-run export``: export the checkpoint ``which`` names (``latest``, ``best``, a
    path or ``step-N``) of the session's model dir into ``out``, on this process alone.

    Raises:
        CheckpointError: for a missing, incomplete or damaged checkpoint, or one written with
            another ``[model]`` or ``[[features]]`` than the session's config.
    """
    session.check()
    view = find_checkpoint(session.model_dir, which)
    differences = view.config_differences(session.raw.data)
    if differences:
        raise CheckpointError(
            f"{view.path} was written with another model or features than {session.raw.source}:\n"
            + "\n".join(f"  {d}" for d in differences)
            + "\nExport it with the config it was trained with (its config is in meta.json), or pass --set to match."
        )
    return export_checkpoint(session.facts, view, as_path(out))

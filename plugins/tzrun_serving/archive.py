"""What a ``.pt2`` archive may hold before ``torch.export.load`` is given it.

``torch.export.load`` is not a data loader: it unpickles weights and constants marked
``use_pickle`` (``torch.load(weights_only=False)``), falls back to unpickling sample inputs that
``weights_only`` refuses, loads custom and opaque objects with pickle, loads AOTInductor shared
libraries, hands every symbolic-shape expression to ``sympy.sympify`` (Python's ``eval``),
``exec``-utes the program's guards when ``.module()`` is called, generates the graph's Python
code from the names it holds, and resolves each node's target as any attribute path under
``torch`` (``torch.os.system`` included). A crafted archive can reach each of these.

So an export's programs are checked here first, on the bytes that will be loaded (no second
read), against what ``tzrec-run export`` writes, and refused otherwise:

* the archive's entries: one root, no duplicates, only the entries of one program named
  ``model`` (its JSON, its weights and constants configs, ``weight_N``/``tensor_N`` payloads,
  its sample inputs, the version files); no legacy ``.pt`` payloads, no AOTInductor, ExecuTorch
  or other directories;
* every weight and constant a plain tensor payload (``use_pickle`` false, no custom or opaque
  objects), and the sample inputs loadable with ``weights_only=True``;
* every node target an ATen or prims operator, or one of the few Python operators and
  symbolic functions that torch.export emits for shapes;
* every symbolic expression and every guard a small arithmetic over symbols, sizes and numbers
  (parsed with :mod:`ast`, never evaluated here), every name in the graph an identifier, every
  parameter or buffer name a dotted path of identifiers, the input and output specs plain
  tuples, lists and dicts with simple keys.

This is an allow-list of what tzrec-run's own exports use: a program that needs more (a custom
operator, a higher-order operator) is refused rather than trusted.
"""

from __future__ import annotations

import ast
import io
import json
import re
import zipfile
from typing import Any, Callable

__all__ = ["ArchiveRefused", "check_archive"]

_PROGRAM = "model"
_FIXED = {"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id",
          f"models/{_PROGRAM}.json", f"data/weights/{_PROGRAM}_weights_config.json",
          f"data/constants/{_PROGRAM}_constants_config.json", f"data/sample_inputs/{_PROGRAM}.pt"}
_PAYLOAD = re.compile(r"^data/(weights/weight|constants/tensor)_\d+$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FQN = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
_KEY = re.compile(r"^[A-Za-z0-9_./-]+$")
_SYMBOL = re.compile(r"^[a-z]+[0-9]+$")
_OPERATOR_NAMESPACES = ("aten", "prims")
_PYTHON_TARGETS = {f"_operator.{n}" for n in ("getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg",
                                              "pow", "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "not_", "pos",
                                              "abs")}
_PYTHON_TARGETS |= {f"torch.{n}" for n in ("sym_max", "sym_min", "sym_not", "sym_float", "sym_int", "sym_ite",
                                           "sym_sqrt", "_sym_sqrt", "sym_sum")}
_PYTHON_TARGETS |= {f"math.{n}" for n in ("ceil", "floor", "trunc", "sqrt")}
#: sympy's constructors as ``srepr`` spells them, and torch's symbolic functions
_SYMPY_CALLS = {"Symbol", "Integer", "Float", "Rational", "Mul", "Add", "Pow", "Max", "Min", "Abs", "Mod", "Eq", "Ne",
                "Lt", "Le", "Gt", "Ge", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan",
                "Equality", "Unequality", "And", "Or", "Not", "FloorDiv", "ModularIndexing", "Where", "PythonMod",
                "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow",
                "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
                "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or"}
_SYMPY_NAMES = {"oo", "zoo", "nan", "true", "false", "S", "Zero", "One", "NegativeOne", "Infinity",
                "NegativeInfinity", "int_oo"}
_GUARD_CALLS = {"Max", "Min", "Abs", "FloorDiv", "Mod", "PythonMod", "CeilToInt", "FloorToInt", "Eq", "Ne",
                "sym_max", "sym_min", "floor", "ceil", "sqrt", "isnan"}
_SIZE_METHODS = {"size", "stride", "storage_offset", "dim", "numel"}
_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not,
               ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_TREE_TYPES = {None, "builtins.tuple", "builtins.list", "builtins.dict"}


class ArchiveRefused(ValueError):
    """A ``.pt2`` archive holds something tzrec-run does not load; the message says what."""


def check_archive(data: bytes) -> None:
    """Refuse ``data`` (a ``.pt2`` archive's bytes) unless loading it with
    ``torch.export.load`` can neither unpickle nor run code that the archive carries.

    Raises:
        ArchiveRefused: naming the first entry or field that is not allowed.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise ArchiveRefused(f"not a torch.export archive (truncated or damaged: {error})") from None
    entries = _entries(names)
    root = names[0].split("/", 1)[0]

    def read(entry: str) -> bytes:
        try:
            return archive.read(f"{root}/{entry}")
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError) as error:
            raise ArchiveRefused(f"entry {entry!r} cannot be read ({error})") from None

    for entry in (f"data/weights/{_PROGRAM}_weights_config.json", f"data/constants/{_PROGRAM}_constants_config.json"):
        if entry in entries:
            _check_payload_config(_json(read(entry), entry), entry, entries)
    if f"data/sample_inputs/{_PROGRAM}.pt" in entries:
        _check_sample_inputs(read(f"data/sample_inputs/{_PROGRAM}.pt"))
    program = f"models/{_PROGRAM}.json"
    if program not in entries:
        raise ArchiveRefused(f"no {program!r}: not a program tzrec-run exported")
    _check_program(_json(read(program), program))


def _entries(names: list[str]) -> set[str]:
    """The archive's entries below its root; refuses any that tzrec-run's exports never hold."""
    if not names:
        raise ArchiveRefused("an empty archive")
    if len(set(names)) != len(names):
        raise ArchiveRefused("an entry appears twice")
    roots = {n.split("/", 1)[0] for n in names}
    if len(roots) != 1 or any("/" not in n for n in names):
        raise ArchiveRefused(f"entries under {len(roots)} roots ({', '.join(sorted(roots)[:3])}); an export has one")
    root = roots.pop()
    entries = {n[len(root) + 1:] for n in names}
    for entry in sorted(entries):
        if entry not in _FIXED and not _PAYLOAD.match(entry):
            raise ArchiveRefused(f"entry {entry!r} is not one a tzrec-run export holds (only the plain tensors, "
                                 f"graph and configs of one program {_PROGRAM!r})")
    return entries


def _json(data: bytes, entry: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as error:
        raise ArchiveRefused(f"entry {entry!r} is not JSON ({error})") from None


def _check_payload_config(config: Any, entry: str, entries: set[str]) -> None:
    """Every weight or constant a plain tensor payload that the archive holds."""
    items = config.get("config") if isinstance(config, dict) else None
    if not isinstance(items, dict):
        raise ArchiveRefused(f"entry {entry!r} has no 'config' object")
    folder = entry.rsplit("/", 1)[0]
    for fqn, meta in items.items():
        if not isinstance(fqn, str) or not _FQN.match(fqn):
            raise ArchiveRefused(f"{entry}: {fqn!r} is not a dotted name of a parameter, buffer or constant")
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            raise ArchiveRefused(f"{entry}: {fqn!r} is stored as a pickle (use_pickle); an export holds plain tensors only")
        path = meta.get("path_name")
        if not isinstance(path, str) or f"{folder}/{path}" not in entries or not _PAYLOAD.match(f"{folder}/{path}"):
            raise ArchiveRefused(f"{entry}: {fqn!r} names the payload {path!r}, which is not a plain tensor entry of the archive")
        if not isinstance(meta.get("tensor_meta"), dict):
            raise ArchiveRefused(f"{entry}: {fqn!r} has no tensor_meta")


def _check_sample_inputs(data: bytes) -> None:
    """The sample inputs load with ``weights_only=True`` (torch would fall back to a full unpickle)."""
    import torch

    if not data:
        return
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:
        first = " ".join(str(error).split())[:160]
        raise ArchiveRefused(f"the sample inputs load only by unpickling arbitrary objects ({type(error).__name__}: {first})") from None


def _check_program(program: Any) -> None:
    """The program's graph, signature, shapes and guards hold only what tzrec-run exports use."""
    if not isinstance(program, dict) or not isinstance(program.get("graph_module"), dict):
        raise ArchiveRefused("the program JSON has no graph_module")
    module = program["graph_module"]
    if module.get("treespec_namedtuple_fields"):
        raise ArchiveRefused("the program declares named tuples; an export's inputs and outputs are dicts of tensors")
    for guard in program.get("guards_code") or ():
        _check_expression(guard, "guard", _guard_node)
    for symbol in program.get("range_constraints") or {}:
        if not _SYMBOL.match(str(symbol)):
            raise ArchiveRefused(f"range constraint {symbol!r} is not a shape symbol")
    for entry in module.get("module_call_graph") or ():
        _check_call_entry(entry)
    _walk(module.get("graph"), "graph")
    _walk(module.get("signature"), "signature")


def _check_call_entry(entry: Any) -> None:
    if not isinstance(entry, dict):
        raise ArchiveRefused("a module_call_graph entry is not an object")
    fqn = entry.get("fqn", "")
    if fqn and not _FQN.match(str(fqn)):
        raise ArchiveRefused(f"module {fqn!r} is not a dotted name")
    signature = entry.get("signature") or {}
    for key in ("in_spec", "out_spec"):
        if signature.get(key) is not None:
            _check_treespec(signature[key], key)
    _walk({k: v for k, v in signature.items() if k not in ("in_spec", "out_spec")}, "module_call_graph")


def _check_treespec(text: Any, where: str) -> None:
    """A pytree spec of tuples, lists and dicts whose keys are simple strings."""
    try:
        spec = json.loads(text)
    except (TypeError, ValueError):
        raise ArchiveRefused(f"{where} is not a JSON tree spec") from None

    def node(n: Any) -> None:
        if not isinstance(n, dict) or n.get("type") not in _TREE_TYPES:
            raise ArchiveRefused(f"{where}: type {n.get('type') if isinstance(n, dict) else n!r} is not a tuple, list or dict")
        if n.get("type") == "builtins.dict":
            keys = json.loads(n.get("context") or "[]")
            if not isinstance(keys, list) or not all(isinstance(k, str) and _KEY.match(k) for k in keys):
                raise ArchiveRefused(f"{where}: dict keys {keys!r} are not simple names")
        for child in n.get("children_spec") or ():
            node(child)

    if not isinstance(spec, list) or len(spec) != 2:
        raise ArchiveRefused(f"{where} is not a versioned tree spec")
    node(spec[1])


def _walk(value: Any, where: str) -> None:
    """Check every field of the graph or signature whose content torch turns into code or a
    lookup: names, targets, operators, expressions, FQNs; refuse custom objects and subgraphs."""
    if isinstance(value, list):
        for item in value:
            _walk(item, where)
        return
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        if key in ("as_custom_obj", "custom_obj", "class_fqn", "as_graph") or (key == "custom_obj_values" and item):
            raise ArchiveRefused(f"{where}: holds a {key!r}; an export holds tensors and ATen operators only")
        if key in ("tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values"):
            for name in item or {}:
                _identifier(name, where)
        if key in ("name", "as_name") and isinstance(item, str):
            _identifier(item, where)
        elif key.endswith("_name") and isinstance(item, str) and not _FQN.match(item):
            raise ArchiveRefused(f"{where}: {key} {item!r} is not a dotted name")
        elif key in ("target", "as_operator") and isinstance(item, str):
            _check_target(item)
        elif key == "expr_str":
            _check_expression(item, "shape expression", _sympy_node)
        elif key in ("nn_module_stack", "stack_trace", "torch_fn", "source_fn_stack", "custom", "from_node"):
            continue  # metadata: kept as text, never run
        _walk(item, where)


def _identifier(name: Any, where: str) -> None:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ArchiveRefused(f"{where}: {name!r} is not an identifier")


def _check_target(target: str) -> None:
    """An ATen or prims operator overload, or one of the Python operators of shape arithmetic."""
    if target in _PYTHON_TARGETS:
        return
    parts = target.split(".")
    if len(parts) == 5 and parts[:2] == ["torch", "ops"] and parts[2] in _OPERATOR_NAMESPACES:
        import torch

        try:
            overload = getattr(getattr(getattr(torch.ops, parts[2]), parts[3]), parts[4])
        except (AttributeError, RuntimeError):
            overload = None
        if isinstance(overload, torch._ops.OpOverload):
            return
    raise ArchiveRefused(f"operator {target!r} is not an ATen or prims operator tzrec-run's exports use")


def _check_expression(text: Any, what: str, allowed: Callable[[ast.AST], bool]) -> None:
    if not isinstance(text, str) or len(text) > 10_000:
        raise ArchiveRefused(f"a {what} that is not a short string")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ArchiveRefused(f"{what} {text[:80]!r} is not an expression") from None
    for node in ast.walk(tree):
        if not allowed(node):
            raise ArchiveRefused(f"{what} {text[:80]!r} holds {type(node).__name__} "
                                 f"{ast.unparse(node)[:60]!r}, which is not shape arithmetic")


def _common(node: ast.AST) -> bool:
    return isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Load, *_ARITHMETIC))


def _number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float, bool)


def _sympy_node(node: ast.AST) -> bool:
    """``srepr`` of a symbolic size: sympy constructors over numbers and symbol names."""
    if _common(node) or _number(node):
        return True
    if isinstance(node, ast.Call):
        return (isinstance(node.func, ast.Name) and node.func.id in _SYMPY_CALLS
                and all(_number(k.value) for k in node.keywords))
    if isinstance(node, ast.keyword):
        return node.arg is not None and bool(_IDENTIFIER.match(node.arg))
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(_SYMBOL.match(node.value))
    if isinstance(node, ast.Name):
        return node.id in _SYMPY_CALLS or node.id in _SYMPY_NAMES or bool(_SYMBOL.match(node.id))
    return False


def _guard_node(node: ast.AST) -> bool:
    """A guard: ``L['inputs']['lengths'].size()[1] == L['inputs']['dense'].size()[0]`` and the like."""
    if _common(node) or _number(node):
        return True
    if isinstance(node, ast.Subscript):
        key = node.slice
        return _number(key) or (isinstance(key, ast.Constant) and isinstance(key.value, str) and bool(_KEY.match(key.value)))
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(_KEY.match(node.value))  # a subscript's key (checked above)
    if isinstance(node, ast.Call):
        func = node.func
        if node.keywords:
            return False
        if isinstance(func, ast.Attribute):
            return func.attr in _SIZE_METHODS or (isinstance(func.value, ast.Name) and func.value.id == "math"
                                                  and func.attr in _GUARD_CALLS)
        return isinstance(func, ast.Name) and func.id in _GUARD_CALLS
    if isinstance(node, ast.Attribute):
        return node.attr in _SIZE_METHODS or (isinstance(node.value, ast.Name) and node.value.id == "math")
    if isinstance(node, ast.Name):
        return node.id in ("L", "math") or node.id in _GUARD_CALLS or bool(_SYMBOL.match(node.id))
    return False

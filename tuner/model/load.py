"""Reading a model file on the user's machine (`tunefarm tune-model`, `tunefarm build`):

- `.pt2`: a `torch.export` program saved with `torch.export.save` (needs torch, an optional
  extra: `pip install torch==2.13.0`);
- `.py`: a Python file defining `model()`, which returns a relax IRModule (BlockBuilder,
  TVMScript in the file or inside `model()`, a frontend's output), a `torch.export` program, or
  any `torch.nn.Module` (the user's own classes included), exported with `torch.export` on what
  `example_inputs()` returns: a tensor, a tuple or list of them (positional arguments), a dict
  (keyword arguments), or a pair (args tuple, kwargs dict);
- anything else: a relax IRModule in TVMScript, parsed and never executed.

A `.py` file is the user's own code, run in the CLI's process like any script they run; the
service never loads a model file (the CLI submits only the PrimFuncs it extracts). The module
stays importable under its own name while `model()` runs (TVMScript's parser reads a class's
source through `sys.modules`).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..core.errors import SpecError
from ..core.tvm_api import IRModule, module_functions, relax_from_exported_program, tvm

if TYPE_CHECKING:
    import torch

__all__ = ["from_torch", "load_model"]


def load_model(path: str | Path) -> IRModule:
    """The relax IRModule of the model in `path` (its weights bound as constants)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"model file {str(p)!r} does not exist", field="model")
    if p.suffix == ".pt2":
        torch = _torch(p)
        return _checked(_convert(torch.export.load(str(p)), p), p)
    if p.suffix == ".py":
        return _from_python(p)
    try:
        mod = tvm.script.from_source(p.read_text())
    except Exception as exc:  # TVMScript's parser raises its own diagnostics
        raise SpecError(f"{p} is not a relax module in TVMScript: {exc}", field="model") from exc
    return _checked(mod, p)


def _torch(p: Path) -> ModuleType:
    try:
        import torch
    except ImportError as exc:
        raise SpecError(f"{p} needs PyTorch: pip install torch==2.13.0", field="model") from exc
    return torch


def _from_python(p: Path) -> IRModule:
    name = "tunefarm_model_" + re.sub(r"\W", "_", p.stem)
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise SpecError(f"cannot import {p}", field="model")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        make = getattr(module, "model", None)
        if not callable(make):
            raise SpecError(f"{p} defines no model() function", field="model")
        return _checked(_to_relax(make(), module, p), p)
    finally:
        sys.modules.pop(name, None)


def _to_relax(obj: Any, module: ModuleType, p: Path) -> IRModule:
    """`model()`'s value as a relax IRModule."""
    if isinstance(obj, tvm.IRModule):
        return obj
    torch = sys.modules.get("torch")  # a torch model means the file imported torch
    if torch is not None and isinstance(obj, torch.export.ExportedProgram):
        return _convert(obj, p)
    if torch is None or not isinstance(obj, torch.nn.Module):
        raise SpecError(f"{p}: model() returned a {type(obj).__name__}, not a relax IRModule, "
                        "a torch.export program or a torch.nn.Module", field="model")
    make_inputs = getattr(module, "example_inputs", None)
    if not callable(make_inputs):
        raise SpecError(f"{p} defines no example_inputs() for its torch model", field="model")
    args, kwargs = _call_args(make_inputs(), torch, p)
    return from_torch(obj, args, kwargs, where=p)


def from_torch(net: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
               *, where: str | Path = "model") -> IRModule:
    """The relax IRModule of the `torch.nn.Module` `net` (in eval mode) exported with
    `torch.export` on `args` and `kwargs`; SpecError naming what torch.export or TVM's frontend
    could not take."""
    import torch

    p = Path(where)
    try:
        with torch.no_grad():
            program = torch.export.export(net.eval(), tuple(args), kwargs or {})
    except Exception as exc:  # torch.export's own errors (graph breaks, data-dependent flow)
        raise SpecError(f"{p}: torch.export could not export the model: "
                        f"{_first_line(exc)}", field="model") from exc
    return _convert(program, p)


def _call_args(value: Any, torch: ModuleType,
               p: Path) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) from what `example_inputs()` returned."""
    if isinstance(value, torch.Tensor):
        return (value,), {}
    if isinstance(value, dict):
        return (), dict(value)
    if (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], tuple | list)
            and isinstance(value[1], dict)):
        return tuple(value[0]), dict(value[1])
    if isinstance(value, tuple | list):
        return tuple(value), {}
    raise SpecError(f"{p}: example_inputs() returned a {type(value).__name__}; expected a "
                    "tensor, a tuple or list of them, a dict of keyword arguments, or "
                    "(args, kwargs)", field="model")


def _convert(program: torch.export.ExportedProgram, p: Path) -> IRModule:
    """TVM's torch frontend on `program`; an operator it cannot convert is named."""
    try:
        return relax_from_exported_program(program)
    except Exception as exc:
        msg = _first_line(exc)
        missing = re.search(r"Unsupported function types? \[(.*?)\]", str(exc))
        if missing:
            msg = f"TVM's torch frontend has no conversion for {missing.group(1)}"
        raise SpecError(f"{p}: cannot convert the model to relax: {msg}", field="model") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def _checked(mod: object, p: Path) -> IRModule:
    if not isinstance(mod, tvm.IRModule) or "main" not in [
            g.name_hint for g in module_functions(mod)]:
        raise SpecError(f"{p} gives no relax module with a main function", field="model")
    if not isinstance(mod["main"], tvm.relax.Function):
        raise SpecError(f"{p}: main is a {type(mod['main']).__name__}, not a relax function",
                        field="model")
    return mod

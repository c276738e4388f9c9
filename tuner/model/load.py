"""Reading a model file on the user's machine (`tunefarm tune-model`, `tunefarm build`):

- `.pt2`: a `torch.export` program saved with `torch.export.save` (needs torch, an optional
  extra: `pip install torch==2.13.0`);
- `.py`: a Python file defining `model()`, which returns a relax IRModule, or a `torch.nn.Module`
  that is exported with `torch.export` on the tensors `example_inputs()` returns;
- anything else: a relax IRModule in TVMScript, parsed and never executed.

A `.py` file is the user's own code, run in the CLI's process like any script they run; the
service never loads a model file (the CLI submits only the PrimFuncs it extracts).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..tvm_api import relax_from_exported_program, tvm

__all__ = ["load_model"]


def load_model(path: str | Path) -> Any:
    """The relax IRModule of the model in `path` (its weights bound as constants)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"model file {str(p)!r} does not exist", field="model")
    if p.suffix == ".pt2":
        torch = _torch(p)
        return _checked(relax_from_exported_program(torch.export.load(str(p))), p)
    if p.suffix == ".py":
        return _from_python(p)
    try:
        mod = tvm.script.from_source(p.read_text())
    except Exception as exc:  # TVMScript's parser raises its own diagnostics
        raise SpecError(f"{p} is not a relax module in TVMScript: {exc}", field="model") from exc
    return _checked(mod, p)


def _torch(p: Path) -> Any:
    try:
        import torch
    except ImportError as exc:
        raise SpecError(f"{p} needs PyTorch: pip install torch==2.13.0", field="model") from exc
    return torch


def _from_python(p: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"tunefarm_model_{p.stem}", p)
    if spec is None or spec.loader is None:
        raise SpecError(f"cannot import {p}", field="model")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    make = getattr(module, "model", None)
    if not callable(make):
        raise SpecError(f"{p} defines no model() function", field="model")
    obj = make()
    if isinstance(obj, tvm.IRModule):
        return _checked(obj, p)
    if not type(obj).__module__.startswith("torch"):
        raise SpecError(f"{p}: model() returned a {type(obj).__name__}, not a relax IRModule or "
                        "a torch.nn.Module", field="model")
    torch = _torch(p)
    if not isinstance(obj, torch.nn.Module):
        raise SpecError(f"{p}: model() returned a {type(obj).__name__}, not a relax IRModule or "
                        "a torch.nn.Module", field="model")
    inputs = getattr(module, "example_inputs", None)
    if not callable(inputs):
        raise SpecError(f"{p} defines no example_inputs() for its torch model", field="model")
    with torch.no_grad():
        program = torch.export.export(obj.eval(), tuple(inputs()))
    return _checked(relax_from_exported_program(program), p)


def _checked(mod: Any, p: Path) -> Any:
    if not isinstance(mod, tvm.IRModule) or "main" not in [g.name_hint for g in mod.functions]:
        raise SpecError(f"{p} gives no relax module with a main function", field="model")
    if not isinstance(mod["main"], tvm.relax.Function):
        raise SpecError(f"{p}: main is a {type(mod['main']).__name__}, not a relax function",
                        field="model")
    return mod

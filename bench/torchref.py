"""PyTorch as its own experts run it on a CPU, the baseline of the model suites
(BASELINE.md): eager under `inference_mode`, `torch.compile` default and max-autotune with
inductor's freezing, channels-last for convolution models; and the check that its outputs are
worth comparing against."""

from __future__ import annotations

import copy
from typing import Any


def checked_reference(name: str, reference: list[Any]) -> list[Any]:
    """PyTorch eager's outputs, the reference of every variant; SystemExit when they are all
    about zero (a deep net with random weights and fresh batch-norm statistics), where the
    output check would compare nothing."""
    import numpy as np

    if max(float(np.abs(r).max()) for r in reference) < 1e-4:
        raise SystemExit(f"{name}: PyTorch's output is about zero everywhere: the output check "
                         "compares nothing (calibrate its batch norm, or scale its weights)")
    return reference



TORCH_COMPILE_MODES = ("default", "max-autotune")


def torch_variants(net: Any, inputs: tuple[Any, ...], torch: Any, *,
                   compiled: bool = True, dtype: str = "float32") -> list[Any]:
    """PyTorch as its experts run it on a CPU (call under `torch.inference_mode()`, threads set
    by the caller): eager, and `torch.compile` in the default and max-autotune modes, each with
    inductor's freezing (constant weights folded: batch norm into convolutions, weights prepacked
    for oneDNN), compiled on its first call here, before any timing; a convolution model also
    channels-last (its inputs converted once, outside the timed call).

    `dtype` "bfloat16": the model and its float inputs converted to bf16 (eager and compiled,
    "pytorch" and "torch.compile ..."), and eager under CPU autocast ("pytorch autocast": bf16
    matmuls, float32 elsewhere, as `tune-model --dtype bfloat16` computes)."""
    from bench.timing import Variant

    out = []
    if dtype == "bfloat16":
        fp32_net, fp32_inputs = net, inputs

        def autocast() -> Any:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fp32_net(*fp32_inputs)

        out.append(Variant("pytorch autocast", fn=autocast))
        net = copy.deepcopy(net).to(torch.bfloat16)
        inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    out.insert(0, Variant("pytorch", fn=lambda: net(*inputs)))
    if not compiled:
        return out
    has_conv = any(isinstance(m, torch.nn.Conv2d) for m in net.modules())
    layouts = [("", net, inputs)]
    if has_conv:
        cl = copy.deepcopy(net).to(memory_format=torch.channels_last)
        layouts.append((", channels-last", cl, tuple(
            x.to(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs)))
    for mode in TORCH_COMPILE_MODES:
        for suffix, model, args in layouts:
            fn = torch.compile(model, mode=None if mode == "default" else mode)
            with torch._inductor.config.patch(freezing=True):
                fn(*args)  # compiled (and frozen) here
            out.append(Variant(f"torch.compile {mode}+freezing{suffix}",
                               fn=lambda fn=fn, args=args: fn(*args)))
    return out

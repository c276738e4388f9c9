"""The `fused` suite: PrimFuncs as a compiler sends them. Small relax models are legalized and fused
the way `ms.relax_integration.extract_tasks` sees them (`LegalizeOps`, `AnnotateTIROpPattern`,
`FoldConstant`, `FuseOps`, `FuseTIR`; weights bound as model constants) and each task becomes a
`tir` workload: int64 indices, relax's names, epilogues, shapes off the 16 grid.

An entry's "model" says how to build it (`spec_of`), its "torch" how PyTorch runs the same op
sequence (`torch_fn`: `F.gelu(F.linear(x, w, b))`, ...), on the task's own inputs in its
parameter order (x, the weight as [K, N] after FoldConstant, the bias, then a residual input).
The tests use the same builders (tests/schedules/test_match.py)."""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import Any

import numpy as np

from tuner.core.tvm_api import make_target, ms, tvm


def fuse() -> Any:
    """The relax passes that turn a model into fused TIR tasks (legalize, annotate, fuse), and
    mark each task's bound constants `layout_free_buffers`, as tunefarm's partition and TVM's
    `static_shape_tuning` pipeline do: MetaSchedule's RewriteLayout then packs those weights at
    compile time, as tunefarm's templates do."""
    from tvm import relax

    return tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
        relax.transform.AttachAttrLayoutFreeBuffers()])


def model(params: dict[str, tuple[int, ...]], body: Callable[..., Any],
          dtype: str = "float32") -> Any:
    """The relax module whose `main` takes `params` (name -> shape) of `dtype` and returns
    `body(bb, **vars)`."""
    from tvm import relax

    bb = relax.BlockBuilder()
    vs = {n: relax.Var(n, relax.TensorType(s, dtype)) for n, s in params.items()}
    with bb.function("main", list(vs.values())):
        with bb.dataflow():
            out = bb.emit_output(body(bb, **vs))
        bb.emit_func_output(out)
    return bb.get()


def tasks(inputs: dict[str, tuple[int, ...]], consts: dict[str, tuple[int, ...]],
          body: Callable[..., Any], *, bind: bool = True) -> dict[str, Any]:
    """{task name: PrimFunc} of the model `body(**vars)` over float32 `inputs` and `consts`
    (bound as constants when `bind`, else function parameters too)."""
    from tvm import relax

    mod = model({**inputs, **consts}, body)
    if bind:
        rng = np.random.default_rng(0)
        mod = relax.transform.BindParams("main", {
            n: tvm.runtime.tensor(rng.uniform(-1, 1, s).astype("float32"))
            for n, s in consts.items()})(mod)
    found = ms.relax_integration.extract_tasks(fuse()(mod), make_target("host"))
    return {t.task_name: t.dispatched[0]["main"] for t in found}


def op(name: str) -> Any:
    """The relax op `name` ("add", "nn.relu", ...)."""
    from tvm import relax

    return reduce(getattr, name.split("."), relax.op)


def linear(m: int, n: int, k: int, act: str | None = None, *, residual: bool = False) -> Any:
    """x[m,k] · w[n,k]ᵀ + b, then `act` ("relu", "gelu", "gelu_tanh", "silu") and a residual
    add of a second input [m, n]: the one fused task relax makes of it."""
    ins = {"x": (m, k), **({"r": (m, n)} if residual else {})}

    def body(bb: Any, x: Any, w: Any, b: Any, r: Any = None) -> Any:
        y = bb.emit(op("linear")(x, w, b))
        if act is not None:
            y = bb.emit(op(f"nn.{act}")(y))
        return op("add")(y, r) if residual else y

    (func,) = tasks(ins, {"w": (n, k), "b": (n,)}, body).values()
    return func


def matmul(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> Any:
    """`R.matmul(a, b)` with both operands inputs (int64 indices, no layout_free attribute)."""
    (func,) = tasks({"a": shape_a, "b": shape_b}, {}, lambda bb, a, b: op("matmul")(a, b)).values()
    return func


def conv2d(n: int, c: int, hw: int, o: int, k: int, *, stride: int = 1, pad: int = 0,
           epilogue: str = "bias_relu", layout: str = "NCHW", depthwise: bool = False) -> Any:
    """`R.nn.conv2d` of x[n, c, hw, hw] with a bound kernel [o, c, k, k] (NCHW; with layout
    "NHWC": x[n, hw, hw, c], kernel [k, k, c, o]; `depthwise`: groups = c = o, kernel
    [c, 1, k, k]), then the `epilogue`'s steps joined by "_": "bias" (a per-channel constant
    added), "bn" (batch norm in inference as ResNet's export has it: subtract, divide,
    multiply, add of per-channel constants), "res" (a second input of the output's shape added),
    "relu", "relu6" (a clip to [0, 6]); "none" for none. Returns the one fused task relax
    makes."""
    steps = _steps(epilogue)
    oh = (hw + 2 * pad - k) // stride + 1
    nchw = layout == "NCHW"
    groups = c if depthwise else 1

    def shaped(ch: int, h: int) -> tuple[int, ...]:
        return (n, ch, h, h) if nchw else (n, h, h, ch)

    ins = {"x": shaped(c, hw), **({"r": shaped(o, oh)} if "res" in steps else {})}
    consts = {"w": (o, c // groups, k, k) if nchw else (k, k, c, o),
              **{name: (1, o, 1, 1) if nchw else (1, 1, 1, o) for name in _conv_consts(steps)}}
    kw = {} if nchw else {"data_layout": "NHWC", "kernel_layout": "HWIO"}

    def body(bb: Any, x: Any, w: Any, r: Any = None, **p: Any) -> Any:
        y = bb.emit(op("nn.conv2d")(x, w, strides=stride, padding=pad, groups=groups, **kw))
        for step in steps:
            if step == "bias":
                y = bb.emit(op("add")(y, p["bias"]))
            elif step == "bn":
                for name, fn in BN_STEPS:
                    y = bb.emit(op(fn)(y, p[name]))
            elif step == "res":
                y = bb.emit(op("add")(y, r))
            elif step == "relu6":
                y = bb.emit(op("clip")(y, 0.0, 6.0))
            else:
                y = bb.emit(op(f"nn.{step}")(y))
        return y

    (func,) = tasks(ins, consts, body).values()
    return func


def activation(shape: tuple[int, ...], act: str) -> Any:
    """`act` ("gelu", "gelu_tanh", "silu", "tanh") of x as BERT's export leaves it between two
    GEMMs: reshaped to [1, *shape], the activation, reshaped back (the one task relax makes)."""
    def body(bb: Any, x: Any) -> Any:
        y = bb.emit(op("reshape")(x, (1, *shape)))
        y = bb.emit(op("tanh" if act == "tanh" else f"nn.{act}")(y))
        return op("reshape")(y, shape)

    (func,) = tasks({"x": shape}, {}, body).values()
    return func


def softmax(shape: tuple[int, ...]) -> Any:
    """Softmax over the last axis of x, then broadcast to its own shape (a copy: the task BERT's
    attention makes)."""
    def body(bb: Any, x: Any) -> Any:
        return op("broadcast_to")(bb.emit(op("nn.softmax")(x, axis=-1)), shape)

    (func,) = tasks({"x": shape}, {}, body).values()
    return func


def norm(shape: tuple[int, ...], kind: str) -> Any:
    """`kind` ("layer_norm" with gamma and beta, or "rms_norm" with gamma) of x over its last
    axis, the weights bound as a model's are (BERT's and Llama's normalisations)."""
    cols = (shape[-1],)
    if kind == "layer_norm":
        consts = {"g": cols, "b": cols}

        def body(bb: Any, x: Any, g: Any, b: Any) -> Any:
            return op("nn.layer_norm")(x, g, b, axes=[-1])
    else:
        consts = {"g": cols}

        def body(bb: Any, x: Any, g: Any) -> Any:  # type: ignore[misc]
            return op("nn.rms_norm")(x, g, axes=[-1])

    (func,) = tasks({"x": shape}, consts, body).values()
    return func


def int8_linear(m: int, n: int, k: int, scale: float = 0.01) -> Any:
    """A quantized linear: uint8 x[m, k] times a bound int8 weight [n, k] (relax folds its
    transpose into a [k, n] constant) to int32, requantized to int8: cast to float32, scaled,
    rounded, clipped to [-128, 127], cast."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "uint8"))
    w = relax.Var("w", relax.TensorType((n, k), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            acc = bb.emit(op("matmul")(x, bb.emit(op("permute_dims")(w)), out_dtype="int32"))
            y = bb.emit(op("multiply")(bb.emit(op("astype")(acc, "float32")),
                                       relax.const(scale, "float32")))
            y = bb.emit(op("clip")(bb.emit(op("round")(y)), -128, 127))
            out = bb.emit_output(op("astype")(y, "int8"))
        bb.emit_func_output(out)
    weight = np.random.default_rng(0).integers(-128, 128, (n, k)).astype("int8")
    mod = relax.transform.BindParams("main", {"w": tvm.runtime.tensor(weight)})(bb.get())
    (task,) = ms.relax_integration.extract_tasks(fuse()(mod), make_target("host"))
    return task.dispatched[0]["main"]


BN_STEPS = (("mean", "subtract"), ("std", "divide"), ("gamma", "multiply"), ("beta", "add"))


def _steps(epilogue: str) -> list[str]:
    """A conv2d epilogue's steps: "bn_res_relu" -> ["bn", "res", "relu"]; "none" -> []."""
    return [] if epilogue == "none" else epilogue.split("_")


def _conv_consts(steps: list[str]) -> list[str]:
    """The per-channel constants of a conv2d epilogue, in the task's parameter order."""
    return [*(["bias"] if "bias" in steps else []),
            *([name for name, _ in BN_STEPS] if "bn" in steps else [])]


# --- the suite ----------------------------------------------------------------------------------

def _lin(i: str, m: int, n: int, k: int, act: str | None = None, *,
         residual: bool = False) -> dict[str, Any]:
    title = f"linear {m}×{k}→{n}" + (f" +{act}" if act else "") + (" +res" if residual else "")
    return {"id": i, "title": title, "peak": "fp32",
            "model": {"kind": "linear", "m": m, "n": n, "k": k, "act": act, "residual": residual}}


def _conv(i: str, c: int, hw: int, o: int, k: int, *, stride: int = 1, pad: int = 0,
          epilogue: str, depthwise: bool = False) -> dict[str, Any]:
    kind = "depthwise" if depthwise else "conv2d"
    title = f"{kind} {k}×{k}/{stride} {c}→{o} {hw}² +{epilogue.replace('_', '+')}"
    return {"id": i, "title": title, "peak": "fp32",
            "model": {"kind": "conv2d", "n": 1, "c": c, "hw": hw, "o": o, "k": k,
                      "stride": stride, "pad": pad, "epilogue": epilogue,
                      "depthwise": depthwise}}


FUSED: list[dict[str, Any]] = [
    _lin("F1", 128, 3072, 768, "gelu"),  # BERT-base FFN in
    _lin("F2", 128, 768, 3072, residual=True),  # FFN out + residual
    _lin("F3", 128, 768, 768),  # attention projection: bias only
    _lin("F4", 197, 768, 768, "relu"),  # ViT tokens: M off the grid
    _lin("F5", 100, 512, 300, "silu"),  # M and K off the grid
    _lin("F6", 50, 1536, 384, "gelu"),
    _lin("F7", 64, 1024, 256, "gelu_tanh"),
    _lin("F8", 256, 512, 512, "relu", residual=True),
    {"id": "F9", "title": "R.matmul 512³ (int64, no epilogue)", "peak": "fp32",
     "model": {"kind": "matmul", "a": [512, 512], "b": [512, 512]}},
    {"id": "F10", "title": "R.matmul (4,128,256)·(256,512) broadcast", "peak": "fp32",
     "model": {"kind": "matmul", "a": [4, 128, 256], "b": [256, 512]}},
    # ResNet-18's convolutions as its torch.export -> relax tasks have them: batch norm as four
    # per-channel steps, a residual input, relu
    _conv("F11", 64, 56, 64, 3, pad=1, epilogue="bn_res_relu"),  # stage 1, second conv
    _conv("F12", 3, 224, 64, 7, stride=2, pad=3, epilogue="bn_relu"),  # the stem
    _conv("F13", 128, 28, 256, 1, stride=2, epilogue="bn"),  # stage 3's downsample
    _conv("F14", 256, 14, 256, 3, pad=1, epilogue="bias_relu"),  # OW = 14
    # MobileNetV2's depthwise convolutions (relax: a conv2d with groups = channels) + batch norm
    # + relu6
    _conv("F15", 144, 56, 144, 3, pad=1, epilogue="bn_relu6", depthwise=True),
    _conv("F16", 384, 14, 384, 3, pad=1, epilogue="bn_relu6", depthwise=True),
    # BERT-base's memory-bound tasks: the GELU its export leaves between two reshapes (not fused
    # into the GEMM before it), the attention's softmax over [batch, heads, rows, cols]
    {"id": "F17", "title": "GELU 128×3072 between reshapes", "peak": "fp32",
     "model": {"kind": "activation", "shape": [128, 3072], "act": "gelu"}},
    {"id": "F18", "title": "softmax 1×12×128×128 + copy", "peak": "fp32",
     "model": {"kind": "softmax", "shape": [1, 12, 128, 128]}},
    # the normalisations: BERT's layer norm, and an RMS norm over Llama's hidden size (a prompt
    # of 128 tokens: [batch, tokens, hidden])
    {"id": "F19", "title": "layer norm 128×768", "peak": "fp32",
     "model": {"kind": "norm", "shape": [128, 768], "norm": "layer_norm"}},
    {"id": "F20", "title": "RMS norm 1×128×2048", "peak": "fp32",
     "model": {"kind": "norm", "shape": [1, 128, 2048], "norm": "rms_norm"}},
    # ViT-B/16's attention softmax: 197 tokens (196 patches and the class token), a row no
    # vector width divides
    {"id": "F21", "title": "softmax 1×12×197×197 + copy", "peak": "fp32",
     "model": {"kind": "softmax", "shape": [1, 12, 197, 197]}},
    # a quantized BERT-base projection: uint8 activations, int8 weight, int32 accumulation,
    # requantized to int8
    {"id": "F22", "title": "int8 linear 128×768→768 +requantize", "peak": "int8",
     "model": {"kind": "int8_linear", "m": 128, "n": 768, "k": 768, "scale": 0.001}},
    # normalisations over rows that no power-of-two vector divides (not a multiple of 4):
    # norm-x86's odd widths (partials of the row's largest divisor up to 16, 32 or 64 lanes)
    {"id": "F23", "title": "layer norm 256×390 (off the 4 grid)", "peak": "fp32",
     "model": {"kind": "norm", "shape": [256, 390], "norm": "layer_norm"}},
    {"id": "F24", "title": "RMS norm 1×128×1026 (off the 4 grid)", "peak": "fp32",
     "model": {"kind": "norm", "shape": [1, 128, 1026], "norm": "rms_norm"}},
]


def spec_of(model: dict[str, Any]) -> dict[str, Any]:
    """The `tir` workload spec of a suite entry's model: the one task relax extracts."""
    if model["kind"] == "linear":
        func = linear(model["m"], model["n"], model["k"], model.get("act"),
                      residual=bool(model.get("residual")))
    elif model["kind"] == "conv2d":
        func = conv2d(model["n"], model["c"], model["hw"], model["o"], model["k"],
                      stride=model["stride"], pad=model["pad"], epilogue=model["epilogue"],
                      depthwise=bool(model.get("depthwise")))
    elif model["kind"] == "activation":
        func = activation(tuple(model["shape"]), model["act"])
    elif model["kind"] == "softmax":
        func = softmax(tuple(model["shape"]))
    elif model["kind"] == "norm":
        func = norm(tuple(model["shape"]), model["norm"])
    elif model["kind"] == "int8_linear":
        func = int8_linear(model["m"], model["n"], model["k"], model["scale"])
    else:
        func = matmul(tuple(model["a"]), tuple(model["b"]))
    return {"op": "tir", "tvmscript": func.script()}


def torch_fn(model: dict[str, Any], inputs: list[np.ndarray], torch: Any) -> tuple[Any, str]:
    """PyTorch running the model's op sequence on the task's inputs (weights converted to
    PyTorch's layout once, outside the timed calls, as packed weights are)."""
    import torch.nn.functional as F

    from .baselines import tensor

    t = [tensor(a, torch) for a in inputs]  # PyTorch's own (aligned) memory
    if model["kind"] == "matmul":
        a, b = t
        return (lambda: torch.matmul(a, b)), "torch.matmul(a, b)"
    if model["kind"] == "conv2d":
        return _torch_conv(model, t, F)
    if model["kind"] == "activation":
        (x,) = t
        fns = {"gelu": F.gelu, "silu": F.silu, "tanh": torch.tanh,
               "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}
        f = fns[model["act"]]
        return (lambda: f(x)), f"{model['act']}(x)"
    if model["kind"] == "softmax":
        (x,) = t
        return (lambda: torch.softmax(x, -1)), "torch.softmax(x, -1)"
    if model["kind"] == "int8_linear":
        x, w_kn = t  # the weight as the task takes it: [k, n]
        s = float(np.float32(model["scale"]))

        def requantized() -> Any:
            y = torch._int_mm(x, w_kn).to(torch.float32) * s
            return torch.clamp(torch.round(y), -128, 127).to(torch.int8)

        return requantized, "torch._int_mm(x_u8, w) -> round(· scale), clamp, int8"
    if model["kind"] == "norm":
        x, g, *beta = t
        cols = (x.shape[-1],)
        if model["norm"] == "layer_norm":
            return (lambda: F.layer_norm(x, cols, g, beta[0], 1e-5)), "F.layer_norm"
        return (lambda: F.rms_norm(x, cols, g, 1e-5)), "F.rms_norm"
    x, w_kn, b, *res = t
    w = w_kn.t().contiguous()
    act = model.get("act")
    acts = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}
    f = acts[act]
    if res:
        r = res[0]
        return (lambda: f(F.linear(x, w, b)) + r), f"{act or ''}(F.linear(x, w, b)) + r"
    return (lambda: f(F.linear(x, w, b))), f"{act or 'id'}(F.linear(x, w, b))"


def _torch_conv(model: dict[str, Any], t: list[Any], F: Any) -> tuple[Any, str]:
    """F.conv2d, then the epilogue as PyTorch runs it: the bias in the convolution, batch norm
    as one `F.batch_norm` (inference: running variance std², its gamma carrying std's sign)."""
    steps = _steps(model["epilogue"])
    x, w, *rest = t
    names = _conv_consts(steps)
    p = {n: v.flatten() for n, v in zip(names, rest, strict=False)}
    res = rest[len(names)] if "res" in steps else None
    kw = {"stride": model["stride"], "padding": model["pad"],
          "groups": model["c"] if model.get("depthwise") else 1}
    bias = p.get("bias")
    if "bn" in steps:
        var, gamma = p["std"] * p["std"], p["gamma"] * p["std"].sign()

    def run() -> Any:
        y = F.conv2d(x, w, bias, **kw)
        if "bn" in steps:
            y = F.batch_norm(y, p["mean"], var, gamma, p["beta"], False, 0.0, 0.0)
        if res is not None:
            y = y + res
        if "relu6" in steps:
            return F.relu6(y)
        return F.relu(y) if "relu" in steps else y

    return run, "F.conv2d" + "".join(f" +{s}" for s in steps)

"""An example model for `tunefarm tune-model` and `tunefarm build` (docs/models.md): a
transformer-style feed-forward block, x → LayerNorm(x + W2·GELU(W1·x + b1) + b2), at batch 32,
hidden 256, FFN 1024, with random constant weights. Written with relax's BlockBuilder, so it
needs no PyTorch; tunefarm imports this file and calls `model()` on your machine only."""

import numpy as np
from tvm import relax

BATCH, HIDDEN, FFN = 32, 256, 1024


def model():
    rng = np.random.default_rng(0)

    def const(*shape):
        return relax.const((rng.standard_normal(shape) / np.sqrt(shape[0])).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((BATCH, HIDDEN), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.add(relax.op.matmul(x, const(HIDDEN, FFN)), const(FFN)))
            h = bb.emit(relax.op.nn.gelu(h))
            h = bb.emit(relax.op.add(relax.op.matmul(h, const(FFN, HIDDEN)), const(HIDDEN)))
            h = bb.emit(relax.op.add(h, x))
            out = bb.emit_output(relax.op.nn.layer_norm(
                h, relax.const(np.ones(HIDDEN, "float32")),
                relax.const(np.zeros(HIDDEN, "float32")), axes=[-1]))
        bb.emit_func_output(out)
    return bb.get()

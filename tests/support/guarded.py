"""Output tensors followed by a guard zone, for tests that run kernels: a kernel that writes past
the end of its output (a partial tile left without its bound) changes the zone and fails the test,
where with a tensor of its own it would corrupt the heap and crash, or hang, a later test."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tuner.core import tvm_api as tv

GUARD = 4096  # elements after each output


class Guarded:
    """A zeroed output of `shape` at the start of a larger buffer whose rest holds a sentinel."""

    def __init__(self, shape: tuple[int, ...], dtype: str, dev: Any) -> None:
        self.size = math.prod(shape)
        fill = np.zeros(self.size + GUARD, dtype)
        self.sentinel = np.array(-7 if np.dtype(dtype).kind in "iu" else np.nan, dtype)
        fill[self.size:] = self.sentinel
        self.base = tv.tvm.runtime.tensor(fill, dev)
        self.tensor = self.base._create_view(tuple(shape))

    def numpy(self) -> np.ndarray:
        """The output, after asserting that nothing was written past it."""
        tail = self.base.numpy()[self.size:]
        intact = np.isnan(tail) if np.isnan(self.sentinel) else tail == self.sentinel
        assert intact.all(), (f"the kernel wrote {int((~intact).sum())} elements past the end of "
                              f"its output, from {int(np.argmin(intact))} elements after it")
        return self.tensor.numpy()


def outputs(specs: list[tuple[Any, str]], dev: Any) -> list[Guarded]:
    """Guarded outputs for (shape, dtype) pairs."""
    return [Guarded(tuple(int(d) for d in s), d, dev) for s, d in specs]

"""The builder function for plain MetaSchedule (TVM_NOTES §8): runs in MetaSchedule's popen
build workers, so it lives in a module with no heavy imports at the top.

The stock `LocalBuilder` imports `tvm.s_tir.tensor_intrin` (~11 s) in a fresh pool for every
batch. This one builds exactly what MetaSchedule's `default_build` builds: the candidate with
its weight-layout-rewrite blocks removed (MetaSchedule's runner then feeds the kernel randomly
filled, already-packed weights, which is how its records are timed).
"""

from __future__ import annotations

from typing import Any


def fast_build(mod: Any, target: Any, _params: Any) -> Any:
    from tuner.core import tvm_api as tv

    return tv.compile_module(tv.strip_layout_rewrite(mod), target)

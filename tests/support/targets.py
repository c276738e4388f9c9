"""Targets for tests that RUN what they build. The CI machine's CPU varies (Zen 5, Zen 4, Zen 3,
Xeon have been seen): code built for `znver4` raises SIGILL on a CPU without AVX-512 and takes the
whole pytest process with it. Tests that only build or inspect may name any CPU; tests that run
use `RUN_X86`: `znver4` where this CPU has AVX-512 (the kernels the templates are tuned for), else
this CPU itself (the same templates at 8 lanes). `AVX2_X86` runs on every CPU seen: the templates'
8-lane (ymm) code on any of them."""

from __future__ import annotations

from typing import Any

from tuner.core import tvm_api as tv

ZNVER4: dict[str, Any] = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
_HAS = tv.tvm_ffi.get_global_func("target.llvm_cpu_has_feature")
HOST_AVX512 = bool(_HAS("avx512f", tv.make_target("host")))
RUN_X86: dict[str, Any] = dict(ZNVER4) if HOST_AVX512 else tv.host_target_dict(num_cores=2)
# AVX2 and FMA, no AVX-512: every x86 CI CPU runs what is built for it
AVX2_X86: dict[str, Any] = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}

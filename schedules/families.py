"""The template table: every template family tunefarm ships, in order of preference.

This tuple is the one list of templates (`schedules.registry` reads it, lazily: a process that
only replays stored traces never imports the templates). Order matters: the "default" space of a
workload is the first template here that applies to it. A template module imports
`schedules.base` (and the knob records, the intrinsics), never the registry.
"""

from __future__ import annotations

from schedules.activation import ActivationX86
from schedules.amx import DenseBF16AMX, DenseInt8AMX
from schedules.arm import DenseInt8SdotAarch64, DenseNeonAarch64
from schedules.base import Template
from schedules.bf16 import DenseBF16AVX512
from schedules.conv import Conv2dNCHWcX86, Conv2dNHWCX86, DepthwiseNCHWX86
from schedules.cuda import DenseWmmaCuda
from schedules.gemm import GemmX86
from schedules.int8 import DenseInt8AVX2, DenseInt8VNNI
from schedules.norm import NormX86
from schedules.softmax import SoftmaxX86

FAMILIES: tuple[type[Template], ...] = (
    GemmX86,
    Conv2dNCHWcX86,
    Conv2dNHWCX86,
    DepthwiseNCHWX86,
    DenseInt8AMX,
    DenseInt8VNNI,
    DenseInt8AVX2,
    DenseBF16AMX,
    DenseBF16AVX512,
    SoftmaxX86,
    NormX86,
    ActivationX86,
    DenseNeonAarch64,
    DenseInt8SdotAarch64,
    DenseWmmaCuda,
)

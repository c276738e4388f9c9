"""Measurement: what the search loop hands a measurer, what comes back, and every measurer.

- `protocol`: the plain data that crosses process and network boundaries unchanged
  (`MeasureInput`, `MeasureResult`, `MeasureOptions`, `Invalidity`) and `gflops`;
- `measurer`: the `Measurer` interface every way of measuring implements;
- the measurers: `local.LocalMeasurer` (this machine: a sandbox child, `sandbox`, builds from
  `builder`, checks and times with `evaluate` and `packing`), `rpc.RpcMeasurer` (boards behind
  a TVM RPC tracker), `remote.RemoteMeasurer` (the farm, through Redis and SQL; `watch` says
  whether any worker serves a device key), `replay.ReplayMeasurer` (recorded results).

Only the data and the interface are re-exported: the rest of the tuning database builds on
them (layer "core" in pyproject.toml's `[tool.tunefarm.layers]`), while the measurers replay
schedules and build kernels (layer "measure").
"""

from __future__ import annotations

from tuner.core.measurements import Invalidity, MeasureInput, MeasureOptions, MeasureResult, gflops

from .measurer import Measurer

__all__ = ["Invalidity", "MeasureInput", "MeasureOptions", "MeasureResult", "Measurer", "gflops"]

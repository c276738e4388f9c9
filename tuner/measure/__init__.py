"""The measurement seam: what the search loop hands a measurer and what comes back.

- `protocol`: the plain data that crosses process and network boundaries unchanged
  (`MeasureInput`, `MeasureResult`, `MeasureOptions`, `Invalidity`) and `gflops`;
- `measurer`: the `Measurer` interface every way of measuring implements (this machine:
  `workers.local.LocalMeasurer`; boards behind a TVM RPC tracker: `workers.rpc.RpcMeasurer`; the
  farm: `tuner.service.measurer.RemoteMeasurer`; recorded results: `tuner.measure.replay`).

`tuner.measure.replay.ReplayMeasurer` is not re-exported: it reads the tuning database, which
itself builds on this package's data.
"""

from __future__ import annotations

from .measurer import Measurer
from .protocol import Invalidity, MeasureInput, MeasureOptions, MeasureResult, gflops

__all__ = ["Invalidity", "MeasureInput", "MeasureOptions", "MeasureResult", "Measurer", "gflops"]

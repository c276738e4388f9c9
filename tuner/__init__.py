"""tunefarm's tuning engine: workloads, search, cost model, measurement protocol, tuning database.

`tuner.core.tvm_api` is the only module that imports TVM; everything else goes through it.
"""

from __future__ import annotations

__version__ = "0.1.0"

"""A tuned record used by a relax build: `tunefarm tune matmul --shape N,N,N` first, then

    python -m bench.relax_apply --n 512 [--db URL] [--threads 2]

builds `R.matmul(x, w)` on N×N float32 tensors through `MetaScheduleApplyDatabase` with
`TunefarmDatabase` (the weight once a parameter, packed on every call, once bound and its packing
split out and folded as a pipeline would), checks the output against numpy and times the VM call
next to the record's latency. TVM's thread pool must have the cores the record was tuned with:
TVM_NUM_THREADS is set from --threads before TVM is imported."""

from __future__ import annotations

import argparse
import os


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--db", default=None, help="database URL (default: TUNEFARM_DATABASE_URL)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))

    import numpy as np
    from tvm import relax

    from bench.fused import model
    from tuner.core.tvm_api import make_target, ms, tvm
    from tuner.db import Store
    from tuner.interop.ms_database import TunefarmDatabase
    from tuner.interop.records import best_record
    from tuner.workloads import parse_spec

    n, target = args.n, make_target("host")
    store = Store(args.db)
    db = TunefarmDatabase(store)
    rec = best_record(store, parse_spec({"op": "matmul", "shape": [n, n, n]}), "host", "local")
    print(f"tuned record: {rec['latency_s'] * 1e3:.3f} ms, {rec['gflops']:.0f} GFLOPS")
    rng = np.random.default_rng(0)
    w_np = rng.uniform(-1, 1, (n, n)).astype("float32")
    x_np = rng.uniform(-1, 1, (n, n)).astype("float32")
    ref = x_np.astype("float64") @ w_np.astype("float64")
    base = model({"x": (n, n), "w": (n, n)}, lambda bb, x, w: relax.op.matmul(x, w))
    for label, bind in (("weight a parameter (packed on every call)", False),
                        ("weight bound (packing split out and folded)", True)):
        mod = base
        if bind:
            mod = relax.transform.BindParams("main", {"w": tvm.runtime.tensor(w_np)})(mod)
        mod = relax.transform.LegalizeOps()(mod)
        (task,) = ms.relax_integration.extract_tasks(mod, target)
        with target, db:
            mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=True)(mod)
        if bind:
            mod = relax.transform.FoldConstant()(relax.transform.SplitLayoutRewritePreproc()(mod))
        vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
        inputs = [tvm.runtime.tensor(x_np)] + ([] if bind else [tvm.runtime.tensor(w_np)])
        err = float(np.abs(vm["main"](*inputs).numpy() - ref).max())
        vm.set_input("main", *inputs)
        t = vm.time_evaluator("invoke_stateful", tvm.cpu(), number=20, repeat=5)("main")
        print(f"{label}: found {db.has_workload(task.dispatched[0])}, max error {err:.1e}, "
              f"{t.median * 1e3:.3f} ms = {rec['latency_s'] / t.median:.2f}x the tuned speed")


if __name__ == "__main__":
    main()

"""Where PyTorch's compiled model spends its time, kernel by kernel (RESULTS.md Run BF):
`python -m bench.torch_profile [--only resnet] [--scale full] [--calls 20]`.

The model of the models suite (bench/model_suite.py, same seed, batch norm calibrated), compiled as
the suite's best variant is (`torch.compile`, inductor's freezing, channels-last for a
convolution model; default mode, which picks the same oneDNN convolutions as max-autotune and
compiles in a fraction of its time), warmed up, then `torch.profiler` over `--calls` calls:
the table of operators by self CPU time, grouped by input shapes, to set beside tunefarm's best
latency per task from the run's database.
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .model_suite import SCALES, _calibrate_batch_norm, _models

    p = argparse.ArgumentParser(prog="python -m bench.torch_profile")
    p.add_argument("--only", default="resnet", help="a model of the models suite")
    p.add_argument("--scale", default="full", choices=sorted(SCALES))
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    net = _models(torch)[a.only](**SCALES[a.scale][a.only])
    inputs = net.inputs()
    _calibrate_batch_norm(net, inputs, torch)
    if any(isinstance(m, torch.nn.Conv2d) for m in net.modules()):
        net = net.to(memory_format=torch.channels_last)
        inputs = tuple(x.to(memory_format=torch.channels_last) if x.dim() == 4 else x
                       for x in inputs)
    with torch.inference_mode():
        fn = torch.compile(net)
        with torch._inductor.config.patch(freezing=True):
            fn(*inputs)
        for _ in range(a.calls):
            fn(*inputs)
        t0 = time.perf_counter()
        for _ in range(a.calls):
            fn(*inputs)
        print(f"{a.only}: {(time.perf_counter() - t0) / a.calls * 1e3:.2f} ms a call")
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(a.calls):
                fn(*inputs)
    print(prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=40,
        max_shapes_column_width=80))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

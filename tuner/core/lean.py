"""`python -m tuner.core.lean MODULE [ARGS...]`: run MODULE as the `__main__` of a child process (a
sandbox, a build process, a TVMScript parser) without the packages no child ever uses.

`tvm_ffi` imports torch whenever torch is installed (a guard against a symbol clash on one
Windows configuration), and so does every `import tvm`. Where torch is installed (a compiler
engineer's environment that exports models with `torch.export`), that costs each child about
2.5 s of start-up and 200 MB of memory, measured on a 2-core Zen 4: `import schedules.registry,
tuner.workloads` took 3.9 s and 414 MB with torch, 1.9 s and 216 MB without. A child builds and
times TVM kernels only; a `None` entry in `sys.modules` makes `import torch` raise ImportError,
which `tvm_ffi` catches. The `tunefarm` command does the same in its own process
(`skip_unused`), except for the commands that may read a model exported from PyTorch.

Standard library only: this module runs before anything else is imported.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys

# never imported by a child; nothing a child runs needs them
SKIPPED = ("torch",)


def skip_unused() -> None:
    """Make `import` of the SKIPPED packages raise ImportError in this process from now on (call
    it before anything imports tvm)."""
    for name in SKIPPED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def argv(module: str, *args: str, idle: bool = False) -> list[str]:
    """The command line that runs `module` (with `args`) as a lean child; `idle`: in the idle
    scheduling class from its first import on (`IDLE`)."""
    return [sys.executable, "-m", "tuner.core.lean", *([IDLE] if idle else []), module, *args]


IDLE = "--idle"


def enter_idle_class() -> None:
    """Run only on CPU time no other process wants: SCHED_IDLE, and the lowest weight for the
    session's autogroup. A child in a session of its own (setsid: no controlling terminal) is
    scheduled in an autogroup of its own, which the kernel weighs against the parent's
    whatever the niceness or class of the tasks inside: two parse children at nice 10 took the
    two cores of a 2-core machine from the API's event loop (/healthz p99 50-80 ms)."""
    # not Linux, or refused: niceness still applies
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
        f.write("19")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == IDLE:
        enter_idle_class()  # before the module's package imports anything
        del sys.argv[1]
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: python -m tuner.core.lean [{IDLE}] MODULE [ARGS...]")
    skip_unused()
    run(sys.argv[1], sys.argv[2:])


def run(module: str, args: list[str]) -> int:
    """Run `module` as `__main__` with `args` as its arguments (here, or in a child forked by
    `tuner.core.zygote`); 0, or what it raises (SystemExit included)."""
    sys.argv = [sys.argv[0], *args]  # the module sees its own arguments
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    main()

"""`python -m tuner.lean MODULE [ARGS...]`: run MODULE as the `__main__` of a child process (a
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

import runpy
import sys

# never imported by a child; nothing a child runs needs them
SKIPPED = ("torch",)


def skip_unused() -> None:
    """Make `import` of the SKIPPED packages raise ImportError in this process from now on (call
    it before anything imports tvm)."""
    for name in SKIPPED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def argv(module: str, *args: str) -> list[str]:
    """The command line that runs `module` (with `args`) as a lean child."""
    return [sys.executable, "-m", "tuner.lean", module, *args]


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m tuner.lean MODULE [ARGS...]")
    skip_unused()
    module = sys.argv[1]
    sys.argv = [sys.argv[0], *sys.argv[2:]]  # the module sees its own arguments
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

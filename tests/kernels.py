"""Kernels that misbehave on purpose, as TVMScript, for the tests of the measurement sandbox, the
RPC boards and the farm."""

from __future__ import annotations

import textwrap

HEADER = "from tvm.script import tirx as T\n\n@T.prim_func(s_tir=True)\n"

# an integer division by a data-dependent zero (inputs are uniform in [-1, 1], so the divisor
# truncates to 0): the kernel dies of SIGFPE at run time. (A data-dependent gather, the old crash
# kernel, is now refused when the workload is parsed.)
CRASH = HEADER + textwrap.dedent('''\
    def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in range(16):
            with T.sblock("B"):
                vi = T.axis.spatial(16, i)
                B[vi] = T.Cast("float32", T.truncdiv(7, T.Cast("int32", A[vi])))
    ''')

# effectively endless: each output is a chain of 2e9 dependent steps (x = sin(x) + a), about 30 s
# at one step per 15 ns whatever the schedule: the update is no commutative reducer, so there is
# no rfactor, and vectorizing or parallelising over the 16 outputs leaves every chain as long.
# The reduction extents fuse to 2e9 (< 2**31): no fused loop overflows int32.
HANG = HEADER + textwrap.dedent('''\
    def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i, j, k in T.grid(16, 40000, 50000):
            with T.sblock("B"):
                vi, vj, vk = T.axis.remap("SRR", [i, j, k])
                with T.init():
                    B[vi] = T.float32(0)
                B[vi] = T.sin(B[vi]) + A[vi]
    ''')

# allocates a 512 MiB scratch buffer (float64, at the allocation cap of max_tensor_elements)
# inside the kernel: past a sandbox address-space limit of 1 GiB, the kernel's own allocation
# fails at run time
ALLOC = HEADER + textwrap.dedent('''\
    def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        C = T.alloc_buffer((67108864,), "float64")
        for i in range(67108864):
            with T.sblock("C"):
                vi = T.axis.spatial(67108864, i)
                C[vi] = T.Cast("float64", A[vi % 16])
        for i in range(16):
            with T.sblock("B"):
                vi = T.axis.spatial(16, i)
                B[vi] = T.Cast("float32", C[vi * 4194304 + 4194303])
    ''')


# --- hostile TVMScript: a valid function with a payload hidden behind a line-breaking character
# every character str.splitlines() breaks at ("\r\n" counts as one line end)
SPLITLINES_BREAKS = ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
                     "\u2029"]
SLOT_BASE = '''from tvm.script import tirx as T

@T.prim_func
def f(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    {slot}
    for i in range(16):
        B[i] = A[i] * T.float32(2)
'''
# where the character goes; {c} is the character, {p} the payload statement
SLOTS = {
    "comment": "# scale by two{c}    {p}",
    "string": 'T.func_attr({{"global_symbol": "f{c}    {p}"}})',
    "docstring": '"""doc{c}    {p}"""',
    "code": "T.evaluate(0){c}    {p}",
}


def payload(mark: str) -> str:
    """A statement that creates the file `mark` if it ever runs."""
    return f'T.evaluate(__import__("pathlib").Path("{mark}").touch() or 0)'


def hidden(char: str, slot: str, mark: str) -> str:
    """SLOT_BASE with the payload hidden after `char` in `slot` (a key of SLOTS)."""
    return SLOT_BASE.format(slot=SLOTS[slot].format(c=char, p=payload(mark)))

"""TVMScript workloads: a valid PrimFunc is accepted and keyed by structure; hostile text is
rejected with SpecError(field="tvmscript") before anything of it runs."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import numpy as np
import pytest

from tuner.core import tvm_api
from tuner.core.config import get_settings
from tuner.core.errors import SpecError
from tuner.workloads import parse_spec, vet_tvmscript

MM = '''from tvm.script import tirx as T

@T.prim_func(s_tir=True)
def mm(A: T.Buffer((32, 32), "float32"), B: T.Buffer((32, 32), "float32"),
       C: T.Buffer((32, 32), "float32")):
    T.func_attr({"global_symbol": "mm", "tirx.noalias": True, "layout_free_buffers": [1]})
    for i, j, k in T.grid(32, 32, 32):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
'''

# a plain (non-sblock) function with two outputs; %s goes into the first buffer's shape
TWO_OUT = '''@T.prim_func
def f(A: T.Buffer((%s,), "float32"), B: T.Buffer((16,), "float32"), C: T.Buffer((16,), "int32")):
    for i in range(16):
        B[i] = A[i] * T.float32(2)
        C[i] = T.Cast("int32", A[i] * T.float32(100))
'''


def tir(text: str, **kw: object) -> dict:
    return {"op": "tir", "tvmscript": text, **kw}


def test_valid_matmul_is_accepted_and_keyed_by_structure() -> None:
    w = parse_spec(tir(MM))
    assert w.key.startswith("tir-") and w.key == f"tir-{w.shash()}"
    assert w.op == "tir" and w.num_outputs == 1
    assert w.flops == 2 * 32 * 32 * 32  # TVM's estimate_tir_flops
    assert w.arg_specs() == [("A", (32, 32), "float32"), ("B", (32, 32), "float32"),
                             ("C", (32, 32), "float32")]
    assert w.description == "tir mm(A[32,32] float32, B[32,32] float32) -> C[32,32] float32"
    assert str(w.prim_func().attrs["global_symbol"]) == "main"
    # the same computation as the built-in op: same TVM structure
    assert w.shash() == parse_spec({"op": "matmul", "shape": [32, 32, 32]}).shash()
    a, b = w.make_inputs()
    (ref,) = w.reference([a, b])  # built and run unscheduled by TVM
    assert np.allclose(ref, a.astype(np.float64) @ b, *w.tolerance())
    assert parse_spec(w.spec) == w


def test_key_ignores_function_and_buffer_names_and_the_import() -> None:
    key = parse_spec(tir(MM)).key
    renamed = MM.replace("def mm", "def other_name").replace('"global_symbol": "mm", ', "")
    for old, new in (("A", "X"), ("B", "Y"), ("C", "Z"), ("vi", "row")):
        renamed = re.sub(rf"\b{old}\b", new, renamed)
    assert "other_name" in renamed and "X: T.Buffer" in renamed
    without_import = MM.replace("from tvm.script import tirx as T\n", "")
    assert parse_spec(tir(renamed)).key == key
    assert parse_spec(tir(without_import)).key == key
    # ...but semantics do change it
    assert parse_spec(tir(MM.replace("T.grid(32, 32, 32)", "T.grid(32, 32, 16)"))).key != key
    assert parse_spec(tir(MM.replace('"tirx.noalias": True', '"tirx.noalias": False'))).key != key


def test_names_that_are_builtins_are_renamed_not_refused() -> None:
    """relax names buffers after a model's inputs (`forward(self, input)`): such a name is data.
    It is renamed everywhere it stands; a call of an allowed builtin keeps calling the builtin."""
    named = MM.replace("A:", "input:").replace("A[", "input[").replace("B:", "id:").replace(
        "B[", "id[").replace("for i, j, k", "for max, j, k").replace("[i, j, k]", "[max, j, k]")
    named = named.replace("T.grid(32, 32, 32)", "T.grid(max(16, 32), 32, 32)")
    vetted = vet_tvmscript(named)
    assert "input_: T.Buffer" in vetted and "id_[vk, vj]" in vetted and "for max_, j, k" in vetted
    assert "T.grid(max(16, 32), 32, 32)" in vetted  # the builtin call is left alone
    assert vet_tvmscript(vetted) == vetted  # the renamed text is its own vetted form
    w = parse_spec(tir(named))
    assert w.key == parse_spec(tir(MM)).key  # the same computation: the same workload
    assert [a[0] for a in w.arg_specs()] == ["input_", "id_", "C"]
    # a fresh name never collides with one the function already has
    taken = MM.replace("A:", "input:").replace("A[", "input[").replace("B:", "input_:").replace(
        "B[", "input_[")
    assert "input__: T.Buffer" in vet_tvmscript(taken)


def test_plain_tir_with_two_outputs() -> None:
    w = parse_spec(tir(TWO_OUT % "16", num_outputs=2))
    assert w.num_outputs == 2 and len(w.make_inputs()) == 1
    assert w.tolerance()[0] > 0  # one float output
    (a,) = w.make_inputs(seed=1)
    b, c = w.reference([a])
    assert np.allclose(b, a * 2) and c.dtype == np.int32
    assert np.array_equal(c, (a * np.float32(100)).astype(np.int32))
    assert parse_spec(tir(TWO_OUT % "16", num_outputs=1)).tolerance() == (0.0, 0.0)


def test_inputs_read_as_a_divisor_are_drawn_away_from_zero() -> None:
    import dataclasses

    from bench.fused import conv2d

    # relax's batch norm: subtract, DIVIDE, multiply, add of per-channel constants
    w = parse_spec(tir(conv2d(1, 8, 6, 32, 3, pad=1, epilogue="bn").script()))
    assert [w.arg_specs()[i][0] for i in w._divisors] == ["param_2"]
    x, kernel, mean, std, gamma, beta = w.make_inputs(seed=0)
    assert np.abs(std).min() >= 0.5 and np.abs(std).max() <= 1 and (std < 0).any()
    # the same draw moved away from 0: the other inputs are what they always were
    plain = dataclasses.replace(w, _divisors=()).make_inputs(seed=0)
    for got, was in zip((x, kernel, mean, gamma, beta), plain[:3] + plain[4:], strict=True):
        assert np.array_equal(got, was)
    assert np.array_equal(np.sign(std), np.sign(plain[3])) and np.abs(plain[3]).min() < 0.5
    assert parse_spec(tir(MM))._divisors == ()


def test_printed_topi_function_round_trips() -> None:
    conv = parse_spec({"op": "conv2d", "shape": [1, 4, 9, 9, 6, 3, 3], "padding": 1, "stride": 2})
    again = parse_spec(tir(conv.prim_func().script()))
    assert again.shash() == conv.shash() and again.flops == conv.flops


# --- hostile input ------------------------------------------------------------------------------

HOSTILE = [  # (name, text with {mark}, message fragment)
    ("dunder-import-in-shape", TWO_OUT % '__import__("os").system("touch {mark}") + 16',
     "'_'"),
    ("import-os",
     "import os\n" + MM.replace("(32, 32)", '(32 + len(os.system("touch {mark}")), 32)', 1),
     "only import"),
    ("import-in-body", TWO_OUT.replace("    for i", "    import os\n    for i") % "16",
     "imports not allowed"),
    ("dunder-attribute-chain",
     TWO_OUT % "len(().__class__.__bases__[0].__subclasses__()) + 16", "'_'"),
    ("eval", TWO_OUT % 'eval("__import__(\'os\').system(\'touch {mark}\')") + 16', "'eval'"),
    ("exec", TWO_OUT % 'exec("open(\'{mark}\', \'w\')") or 16', "'exec'"),
    ("open", TWO_OUT % 'open("{mark}", "w") and 16', "'open'"),
    ("getattr", TWO_OUT % 'getattr(T, "call_extern") and 16', "'getattr'"),
    ("globals", TWO_OUT % 'len(globals()) + 16', "'globals'"),
    ("lambda", TWO_OUT % '(lambda: 16)()', "lambda"),
    ("comprehension", TWO_OUT % 'len([open("{mark}", "w") for _ in range(1)]) + 16',
     "comprehensions"),
    ("starred-call", TWO_OUT % 'max(*[16, 1])', "starred"),
    ("kwargs-call", TWO_OUT.replace('T.Buffer((16,), "int32")',
                                    'T.Buffer((16,), **{{"dtype": "int32"}})') % "16", "**kwargs"),
    ("walrus", TWO_OUT % '(n := 16)', "assignment expressions"),
    ("fstring", TWO_OUT % 'len(f"{{16}}") + 15', "f-strings"),
    ("pow-bomb", TWO_OUT % '16 + 0 * 10 ** 10 ** 10', "'**'"),
    ("shift-bomb", TWO_OUT % '16 + 0 * (1 << 10000000000)', "'<<'"),
    ("string-bomb", TWO_OUT % 'len("%999999999d" % 1) - 999999983', "strings"),
    ("extern-call", TWO_OUT.replace("        B[i] =", '        T.evaluate(T.call_extern("int32", '
                                    '"system", "touch {mark}"))\n        B[i] =') % "16",
     "T.call_extern is not allowed"),
    ("packed-call", TWO_OUT.replace("        B[i] =", '        T.evaluate(T.call_packed('
                                    '"runtime.x"))\n        B[i] =') % "16", "T.call_packed"),
    ("parser-module", TWO_OUT % 'T.parser.entry.tvm.support and 16', "T.parser"),
    ("buffer-data", TWO_OUT % 'A.data and 16', "A.data"),
    ("aliasing", TWO_OUT.replace("    for i", '    D = T.Buffer((1 << 30,), "float32", '
                                 'data=A.data)\n    for i') % "16", "data="),
    ("shadow-T", TWO_OUT.replace("    for i", "    T = 1\n    for i") % "16", "reserved"),
    ("while", TWO_OUT.replace("    for i in range(16):", "    while True:") % "16", "while"),
    ("try", TWO_OUT.replace("    for i in range(16):", "    try:\n        pass\n    except:\n"
                            "        pass\n    for i in range(16):") % "16", "try"),
    ("class", MM + "\nclass X:\n    pass\n", "exactly one top-level function"),
    ("two-functions", MM + "\n\n" + MM.replace("def mm", "def mm2").split("\n", 1)[1],
     "exactly one top-level function"),
    ("no-decorator", MM.replace("@T.prim_func(s_tir=True)\n", ""), "decorated with @T.prim_func"),
    ("other-decorator", MM.replace("@T.prim_func(s_tir=True)", "@T.macro"), "T.prim_func"),
    ("decorator-kwargs", MM.replace("s_tir=True", "s_tir=True, check_well_formed=False"),
     "accepts only"),
    ("syntax-error", MM.replace("for i, j, k in", "for i, j, k im"), "line 7: syntax error"),
    ("too-deep", TWO_OUT % ("-" * 200 + "16"), "nesting deeper"),
    ("pragma-import-llvm",
     TWO_OUT.replace("for i in range(16):", 'for i in T.serial(16, annotations='
                     '{{"pragma_import_llvm": "declare i32 @system(ptr)"}}):') % "16",
     "pragma annotations"),
    ("range-outside-loop", TWO_OUT % "max(range(1 << 60))", "range() is only allowed"),
    ("long-string", TWO_OUT.replace('"float32"),', '"' + "f" * 500 + '"),', 1) % "16",
     "string constants"),
]


@pytest.fixture
def mark(tmp_path: Path) -> Path:
    return tmp_path / f"pwned-{uuid.uuid4().hex}"


@pytest.fixture
def parser_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records (and refuses) every call of TVM's TVMScript parser."""
    calls: list[str] = []

    def refuse(text: str) -> None:
        calls.append(text)
        raise RuntimeError("the parser must not see this text")

    monkeypatch.setattr(tvm_api, "prim_func_from_tvmscript", refuse)
    return calls


@pytest.mark.parametrize("name,text,fragment", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_text_is_rejected_before_parsing(name: str, text: str, fragment: str, mark: Path,
                                                 parser_calls: list[str]) -> None:
    payload = text.replace("{mark}", str(mark)).replace("{{", "{").replace("}}", "}")
    with pytest.raises(SpecError) as info:
        parse_spec(tir(payload))
    assert info.value.field == "tvmscript"
    assert fragment in str(info.value), str(info.value)
    assert parser_calls == [] and not mark.exists()


def test_tvm_parser_alone_would_run_the_payload(mark: Path) -> None:
    """Why the vetting exists: TVM's parser evaluates Python in shape expressions."""
    text = TWO_OUT.replace("    for i", f'    T.evaluate(__import__("pathlib").Path("{mark}")'
                           '.touch() or 0)\n    for i') % "16"
    tvm_api.prim_func_from_tvmscript(text)
    assert mark.exists()


def test_oversized_text(parser_calls: list[str]) -> None:
    limit = get_settings().max_tvmscript_bytes
    with pytest.raises(SpecError, match=f"the limit is {limit}") as info:
        parse_spec(tir(MM + "#" * limit))
    assert info.value.field == "tvmscript" and parser_calls == []


def test_too_many_nodes(monkeypatch: pytest.MonkeyPatch, parser_calls: list[str]) -> None:
    monkeypatch.setattr(get_settings(), "max_tvmscript_nodes", 50)
    with pytest.raises(SpecError, match="more than 50 syntax nodes"):
        vet_tvmscript(MM)


@pytest.mark.parametrize("text,fragment", [
    (TWO_OUT % "16384 * 16384", "the limit (max_tensor_elements)"),  # 2^28 > 2^26 elements
    (TWO_OUT.replace("B[i] = A[i]", "B[i] = A[i + 1]") % "16",
     "Out of bounds memory access on buffer A"),
    (TWO_OUT.replace("for i in range(16)", "for i, j, k in T.grid(100000, 100000, 100000)")
     % "16", "iterations"),
    (TWO_OUT.replace("    for i", '    T.func_attr({"foo": 1})\n    for i') % "16",
     "function attribute(s) foo"),
    # bombs: a loop of no arithmetic still runs (and its reference runs it), nested unrolls
    # expand to their product, a dimension can be huge in a buffer of no element
    (TWO_OUT.replace("    for i in range(16):", "    for p, q in T.grid(1000000, 1000000):\n"
                     "        T.evaluate(0)\n    for i in range(16):") % "16", "max_iterations"),
    (TWO_OUT.replace("    for i in range(16):", "    for p in T.unroll(256):\n"
                     "        for q in T.unroll(256):\n            for r in T.unroll(256):\n"
                     "                T.evaluate(0)\n    for i in range(16):") % "16",
     "expand to 65536 copies"),
    (TWO_OUT.replace('"float32"), B:', '"float32"), D: T.Buffer((0, 1099511627776), '
                     '"float32"), B:', 1) % "16", "has a dimension of 1099511627776"),
    (TWO_OUT.replace("    for i", '    X = T.alloc_buffer((0, 1 << 40), "float32")\n    for i')
     % "16", "has a dimension of 1099511627776"),
    (TWO_OUT.replace("        B[i] =", "        T.evaluate(T.undefined_thing(1))\n        B[i] =")
     % "16", "T.undefined_thing is not allowed"),
    (TWO_OUT.replace("T.float32(2)", "T.float32(q)") % "16", "unknown name 'q'"),
    (TWO_OUT.replace('"float32"), B', '"float8_e4m3fn"), B') % "16", "dtype float8_e4m3fn"),
    (MM.replace("with T.init():", "with T.init(1, 2, 3):"), "TVMScript parser:"),
    (MM.replace('T.axis.remap("SSR"', 'T.axis.remap("SS"'), "TVMScript parser: line"),
])
def test_invalid_functions_are_rejected(text: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(tir(text))
    assert info.value.field == "tvmscript"
    assert fragment in str(info.value), str(info.value)


def test_pragma_annotations_are_rejected_after_parsing_too() -> None:
    """Defense in depth behind the text check: pragma_import_llvm would link LLVM IR (which can
    run code at load time) into the reference build."""
    from tuner.workloads.tir import _count_iterations

    func = tvm_api.prim_func_from_tvmscript(TWO_OUT.replace(
        "for i in range(16):", 'for i in T.serial(16, annotations={"pragma_import_llvm": "x"}):')
        % "16")
    with pytest.raises(SpecError, match="pragma_import_llvm"):
        _count_iterations(func.body, 10**6)


def test_non_string_and_empty() -> None:
    for bad in (None, 5, b"@T.prim_func", "", "   \n"):
        with pytest.raises(SpecError) as info:
            vet_tvmscript(bad)
        assert info.value.field == "tvmscript"

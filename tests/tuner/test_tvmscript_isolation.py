"""TVMScript never executes: one canonical text is vetted and parsed, the parse happens in a
throwaway child process (real processes, TVM's real parser), and the parsed function is refused
for data-dependent indexing and past the vectorize/unroll/allocation caps.

The marker directory is world-writable so that a payload that did run in the (unprivileged)
parse child could create the marker: its absence means nothing ran."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.kernels import SLOT_BASE as BASE
from tests.kernels import SLOTS, SPLITLINES_BREAKS, hidden, payload
from tests.support import guarded
from tuner.core import tvm_api
from tuner.core.config import get_settings
from tuner.core.errors import SpecError
from tuner.workloads import isolate, parse_spec, vet_tvmscript
from tuner.workloads.tvmscript import canonical_text

LINE_ENDS = ("\n", "\r", "\r\n")  # normalised to "\n": the hidden code becomes visible code


def tir(text: str, **kw: object) -> dict[str, Any]:
    return {"op": "tir", "tvmscript": text, **kw}


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    isolate.clear_cache()
    yield
    isolate.clear_cache()


def test_the_payload_is_live(mark: Path) -> None:
    """Control: the payload does run when TVM's parser gets it as code."""
    text = BASE.format(slot=payload(str(mark))).replace("from tvm.script import tirx as T\n", "")
    tvm_api.prim_func_from_tvmscript(text)
    assert mark.exists()


@pytest.mark.parametrize("slot", sorted(SLOTS))
@pytest.mark.parametrize("char", SPLITLINES_BREAKS, ids=[f"U+{ord(c[-1]):04X}" + (
    "-crlf" if c == "\r\n" else "") for c in SPLITLINES_BREAKS])
def test_line_breaking_characters_are_rejected_or_inert(char: str, slot: str, mark: Path,
                                                        fresh_cache: None) -> None:
    text = hidden(char, slot, str(mark))
    assert len(text.splitlines()) > len(BASE.splitlines())  # the character does break a line
    try:
        w = parse_spec(tir(text))
    except SpecError as exc:
        assert exc.field == "tvmscript"
        if char not in LINE_ENDS:  # refused by the canonical-text check, named with its line
            assert f"U+{ord(char):04X}" in str(exc) and "line 5:" in str(exc), str(exc)
    else:  # accepted only as inert data: a docstring, with nothing of it in the function
        assert slot == "docstring" and char in LINE_ENDS
        assert "pathlib" not in w.prim_func().script()
    assert not mark.exists()


def test_every_other_control_character_is_rejected_anywhere() -> None:
    ok = BASE.format(slot="T.evaluate(0)")
    for c in ["\x00", "\x01", "\x1b", "\x1f", "\x7f", "\x9f", "\u200b", "\u202e", "\ufeff"]:
        for where in (ok + f"# x{c}\n", ok.replace('"float32"', f'"float{c}32"', 1),
                      ok.replace("T.evaluate(0)", f"T.evaluate({c}0)")):
            with pytest.raises(SpecError, match=f"U\\+{ord(c):04X}") as info:
                vet_tvmscript(where)
            assert info.value.field == "tvmscript"


def test_canonical_text_normalises_line_ends_once() -> None:
    assert canonical_text("a\r\nb\rc\n") == "a\nb\nc\n"
    assert canonical_text("a\r\r\nb") == "a\n\nb"
    assert canonical_text("tab\there é → ✓") == "tab\there é → ✓"
    with pytest.raises(SpecError, match="line 3: character U\\+2028 \\(line separator\\)"):
        canonical_text("a\r\nb\n#\u2028c")


def test_vetted_text_is_the_canonical_text_minus_the_import() -> None:
    text = BASE.format(slot="T.evaluate(0)  # é → ✓").replace("\n", "\r\n")
    vetted = vet_tvmscript(text)
    lines = canonical_text(text).split("\n")
    assert vetted.split("\n") == ["", *lines[1:]]
    crlf = parse_spec(tir(text))
    assert crlf.key == parse_spec(tir(text.replace("\r\n", "\n"))).key


def test_the_calling_process_never_runs_the_tvmscript_parser(monkeypatch: pytest.MonkeyPatch,
                                                             fresh_cache: None) -> None:
    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("TVMScript parsed in the calling process")

    monkeypatch.setattr(tvm_api.tvm.script, "from_source", refuse)
    monkeypatch.setattr(tvm_api, "prim_func_from_tvmscript", refuse)
    w = parse_spec(tir(BASE.format(slot="T.evaluate(0)")))
    assert w.arg_specs() == [("A", (16,), "float32"), ("B", (16,), "float32")]
    assert str(w.prim_func().attrs["global_symbol"]) == "main"


def test_results_are_cached_by_content(monkeypatch: pytest.MonkeyPatch,
                                       fresh_cache: None) -> None:
    starts: list[str] = []
    real = isolate._parse_in_child

    def counting(texts: list[str]) -> Any:
        starts.extend(texts)
        return real(texts)

    monkeypatch.setattr(isolate, "_parse_in_child", counting)
    text = BASE.format(slot="T.evaluate(0)")
    bad = text.replace("T.float32(2)", "T.float32(2, 3, 4)")  # refused by TVM's parser
    for _ in range(3):
        assert parse_spec(tir(text)).key.startswith("tir-")
        with pytest.raises(SpecError, match="TVMScript parser"):
            parse_spec(tir(bad))
    assert len(starts) == 2


def test_a_models_texts_share_one_child(monkeypatch: pytest.MonkeyPatch,
                                        fresh_cache: None) -> None:
    """`isolate.prime`: one child parses a chunk of one submitter's texts into the cache, a
    rejection included; `parse_spec` then starts no child for them."""
    children: list[int] = []
    real = isolate._parse_in_child

    def counting(texts: list[str]) -> Any:
        children.append(len(texts))
        return real(texts)

    monkeypatch.setattr(isolate, "_parse_in_child", counting)
    texts = [BASE.format(slot=f"T.evaluate({i})") for i in range(5)]
    bad = texts[0].replace("T.float32(2)", "T.float32(2, 3, 4)")
    isolate.prime([vet_tvmscript(t) for t in [*texts, bad]], chunk=4)
    assert children == [4, 2]
    keys = {parse_spec(tir(t)).key for t in texts}
    with pytest.raises(SpecError, match="TVMScript parser"):
        parse_spec(tir(bad))
    assert len(keys) == 5 and children == [4, 2]


def test_a_child_over_its_limits_is_a_spec_error(monkeypatch: pytest.MonkeyPatch,
                                                 fresh_cache: None) -> None:
    monkeypatch.setattr(get_settings(), "sandbox_memory_mb", 64)  # too little to import TVM
    with pytest.raises(SpecError, match="the TVMScript parser failed") as info:
        parse_spec(tir(BASE.format(slot="T.evaluate(0)")))
    assert info.value.field == "tvmscript" and "address space 64 MiB" in str(info.value)


def test_a_slow_child_is_killed_and_a_spec_error(monkeypatch: pytest.MonkeyPatch,
                                                 fresh_cache: None) -> None:
    # a forked parse child answers in ~10 ms: a millisecond is too short for any
    monkeypatch.setattr(get_settings(), "parse_timeout_s", 0.001)
    with pytest.raises(SpecError, match=r"the TVMScript parser timed out after 0\.001 s"):
        parse_spec(tir(BASE.format(slot="T.evaluate(1)")))
    monkeypatch.setattr(get_settings(), "parse_timeout_s", 60.0)
    assert parse_spec(tir(BASE.format(slot="T.evaluate(1)"))).key  # not cached as a failure


PLAIN = '''@T.prim_func(s_tir=True)
def f(A: T.Buffer((64,), "int32"), B: T.Buffer((64,), "float32")):
    {body}
'''


@pytest.mark.parametrize("body,fragment", [
    ("for i in range(64):\n        B[A[i]] = T.float32(1)", "an index of buffer B"),
    ("for i in range(64):\n        B[i] = T.Cast(\"float32\", A[A[i] % 64])",
     "an index of buffer A"),
    ("for i in range(64):\n        j: T.int32 = A[i] + 1\n        B[j % 64] = T.float32(1)",
     "an index of buffer B"),
    ("X = T.alloc_buffer((1,), \"int32\")\n    for i in range(64):\n        X[0] = A[i]\n"
     "        B[X[0]] = T.float32(1)", "an index of buffer B"),
    ("for i in range(64):\n        with T.sblock(\"x\"):\n            vi = T.axis.spatial(64, "
     "A[i])\n            B[vi] = T.float32(2)", "an index of buffer B"),
], ids=["store-index", "load-index", "through-a-variable", "through-a-local-buffer",
        "through-a-block-iterator"])
def test_data_dependent_indexing_is_kept_in_bounds(body: str, fragment: str) -> None:
    """Each form indexes a buffer by a value read from a buffer: the index is clamped into the
    buffer (`tuner.workloads.bounds`), so hostile values in A never write outside B."""
    w = parse_spec(tir(PLAIN.format(body=body)))
    buf = fragment.rsplit(" ", 1)[-1]
    dev = tvm_api.tvm.cpu()
    ex = tvm_api.tvm.compile(tvm_api.tvm.IRModule({"main": w.prim_func()}), target="llvm")
    hostile = np.random.default_rng(0).integers(-(2**31), 2**31 - 1, 64).astype("int32")
    (out,) = guarded.outputs([((64,), "float32")], dev)
    ex["main"](tvm_api.tvm.runtime.tensor(hostile, dev), out.tensor)
    got = out.numpy()  # asserts that nothing was written past B
    assert buf == "A" or np.isin(got, [0.0, 1.0, 2.0]).all()


def test_data_dependent_loop_bounds_are_rejected() -> None:
    body = "for i in range(64):\n        for j in range(A[i]):\n            B[j] = T.float32(1)"
    with pytest.raises(SpecError, match="loop extent must be a constant"):
        parse_spec(tir(PLAIN.format(body=body)))


def test_data_independent_indexing_is_accepted() -> None:
    body = ("for i in range(64):\n        B[(i * 7 + 3) % 64] = T.Cast(\"float32\", A[63 - i])"
            " + T.float32(A[i] > 0)")
    assert parse_spec(tir(PLAIN.format(body=body))).key.startswith("tir-")


LOOP = '''@T.prim_func
def f(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32")):
    for o in range(1024 // {n}):
        for i in T.{kind}({n}):
            B[o * {n} + i] = A[o * {n} + i]
'''


@pytest.mark.parametrize("kind,limit", [("vectorized", 64), ("unroll", 256)])
def test_vectorize_and_unroll_extents_are_capped(kind: str, limit: int) -> None:
    assert parse_spec(tir(LOOP.format(kind=kind, n=limit))).key.startswith("tir-")
    with pytest.raises(SpecError, match=f"T.{kind} loop i has extent {limit * 2}; the limit is "
                                        f"{limit}"):
        parse_spec(tir(LOOP.format(kind=kind, n=limit * 2)))


ALLOC = '''@T.prim_func(s_tir=True)
def f(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    X = T.alloc_buffer(({n},), "float32")
    for i in range(16):
        with T.sblock("y"):
            vi = T.axis.remap("S", [i])
            Y = T.sblock_alloc_buffer(({n},), "float32")
            X[vi] = A[vi]
            Y[vi] = X[vi]
            B[vi] = Y[vi]
'''


def test_total_allocation_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(get_settings(), "max_tensor_elements", 1000)
    assert parse_spec(tir(ALLOC.format(n=500))).key.startswith("tir-")  # 500 + 500
    with pytest.raises(SpecError, match="allocates more than 1000 buffer elements in all"):
        parse_spec(tir(ALLOC.format(n=501)))  # each buffer alone is within the limit

"""Vetting of untrusted TVMScript text BEFORE it reaches TVM's parser.

The TVMScript parser evaluates Python expressions (shapes, decorator arguments, call arguments)
with Python's `eval`, builtins included: `T.Buffer((__import__("os").system("..."),), ...)` would
run. So the text is first checked with Python's `ast` against an allowlist:

* size (`max_tvmscript_bytes`), node count (`max_tvmscript_nodes`) and nesting depth limits;
* exactly one top-level function, decorated with `@T.prim_func` or `@T.prim_func(s_tir=...)`,
  optionally preceded by `from tvm.script import tirx as T` (the only import allowed);
* only statement/expression node types that plain TIR needs (no lambda, comprehension, class,
  global/nonlocal, async/await/yield, try/raise/del, starred calls, walrus, f-strings, `**`);
* no name or attribute starting with `_`; names must be `T`, a few builtins (range, len, min,
  max, int, float) or names bound by the function itself; binding `T` is refused, and a bound
  name that is also a builtin or one of the parser's globals (`input`, `id`, `max`, `tvm`: relax
  names buffers after a model's inputs) is renamed to a fresh one before the text is vetted
  again and parsed (`_renamed`), so names stay data;
* calls only to allowlisted `T.*` functions (nothing that calls external or packed functions,
  takes raw pointers, or expands macros) and the builtins above; no `data=` keyword (aliasing);
* short string constants, bounded integers, `<<` only by a small constant, no operators on
  sequence or string literals, `range()` only as a for-loop iterable (memory / CPU bombs);
* no string starting with "pragma" (a loop annotation `pragma_import_llvm` links LLVM IR text
  into the reference build).

One canonical text: before any of this, "\r\n" and a lone "\r" become "\n" (once), and every
other line-breaking character (\v, \f, \x1c-\x1e, \x85, \u2028, \u2029) and every control or
format character except tab and newline is refused wherever it stands (comments and strings
included): `str.splitlines()` breaks lines at characters Python's tokenizer treats as ordinary
inside a comment, so any later re-splitting of the text could reveal code the vetter never saw.
The AST of exactly that canonical text is vetted, and the parser receives exactly that text
(the optional import line blanked by splitting on "\n" only; the result is checked to have the
vetted AST).

Then the text is parsed in a throwaway child process (`isolate.parse_isolated`: clean
environment, resource limits, no root; never in a process that holds credentials), which vets
it again and returns the PrimFunc as TVM JSON (TVM 0.27's parser refuses imports in source
strings and supplies `T` itself). Parser errors become `SpecError(field="tvmscript")` with the
first meaningful line of the message, and every parameter must be a compact T.Buffer with a
constant shape within `max_tensor_elements`. `tir.py` checks the parsed function further
(loops, allocations, function attrs, pragmas, data-dependent indexing, out-of-bounds accesses).
"""

from __future__ import annotations

import ast
import math
import threading
import unicodedata
from typing import TYPE_CHECKING, cast

from ..core.config import get_settings
from ..core.errors import SpecError
from .isolate import parse_isolated, prime
from .tvmscript_rules import (
    ALLOWED_BUILTINS,
    BANNED_CATEGORIES,
    CHAR_NAMES,
    DECORATOR_KWARGS,
    FIELD,
    LINE_BREAKS,
    MAX_AST_DEPTH,
    MAX_INT,
    MAX_STRING_CHARS,
    NICE,
    NODES,
    RESERVED_NAMES,
    T_ATTRS,
    T_SUBATTRS,
    UNBINDABLE,
    VALUE_ATTRS,
)

if TYPE_CHECKING:
    from ..core.tvm_api import PrimFunc


def _fail(msg: str, node: ast.AST | SyntaxError | None = None) -> SpecError:
    line = getattr(node, "lineno", None)
    return SpecError(f"line {line}: {msg}" if line else msg, field=FIELD)


def _is_import_t(node: ast.stmt) -> bool:
    return (isinstance(node, ast.ImportFrom) and node.module == "tvm.script" and node.level == 0
            and len(node.names) == 1 and node.names[0].name == "tirx"
            and node.names[0].asname == "T")


def _is_t_prim_func(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "prim_func"
            and isinstance(node.value, ast.Name) and node.value.id == "T")


# CPython 3.11 keeps the AST converter's recursion depth in interpreter-wide state: two threads
# parsing at once can fail with "SystemError: AST constructor recursion depth mismatch" (seen in
# CI: the API vets a model's tasks in parallel threads). One parse at a time; the costly part, the
# TVMScript parse in a child process, still runs in parallel.
_AST_LOCK = threading.Lock()


def parse_python(text: str) -> ast.Module:
    """`ast.parse(text)`, one thread at a time."""
    with _AST_LOCK:
        return ast.parse(text, mode="exec")


def _check_limits(text: str) -> ast.Module:
    limits = get_settings()
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_tvmscript_bytes:
        raise _fail(f"text is {size} bytes; the limit is {limits.max_tvmscript_bytes}")
    try:
        tree = parse_python(text)
    except SyntaxError as exc:
        raise _fail(f"syntax error: {exc.msg}", exc) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise _fail(f"cannot parse: {type(exc).__name__}: {exc}") from None
    count, depth = 0, 0
    stack: list[tuple[ast.AST, int]] = [(tree, 1)]
    while stack:
        node, d = stack.pop()
        count += 1
        depth = max(depth, d)
        if count > limits.max_tvmscript_nodes:
            raise _fail(f"more than {limits.max_tvmscript_nodes} syntax nodes")
        if d > MAX_AST_DEPTH:
            raise _fail(f"nesting deeper than {MAX_AST_DEPTH} levels", node)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return tree


def _check_structure(tree: ast.Module) -> ast.FunctionDef:
    body = list(tree.body)
    if body and _is_import_t(body[0]):
        body = body[1:]
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            raise _fail("the only import allowed is 'from tvm.script import tirx as T' "
                        "(first line; TVM 0.27 renamed the tir script module tirx)", node)
    funcs = [n for n in body if isinstance(n, ast.FunctionDef)]
    if len(funcs) != 1 or len(body) != 1:
        what = ", ".join(type(n).__name__ for n in body) or "nothing"
        raise _fail(f"expected exactly one top-level function (a @T.prim_func); found {what}")
    fn = funcs[0]
    if len(fn.decorator_list) != 1:
        raise _fail("the function must be decorated with @T.prim_func (and nothing else)", fn)
    dec = fn.decorator_list[0]
    if isinstance(dec, ast.Call) and _is_t_prim_func(dec.func):
        if dec.args:
            raise _fail("@T.prim_func takes no positional arguments", dec)
        for kw in dec.keywords:
            if kw.arg not in DECORATOR_KWARGS or not isinstance(kw.value, ast.Constant) \
                    or not isinstance(kw.value.value, bool):
                raise _fail(f"@T.prim_func(...) accepts only {sorted(DECORATOR_KWARGS)} "
                            "with a True/False value", dec)
    elif not _is_t_prim_func(dec):
        raise _fail("the function must be decorated with @T.prim_func", fn)
    a = fn.args
    if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults or a.kw_defaults:
        raise _fail("parameters must be plain annotated names (no defaults, *args, **kwargs)", fn)
    if not a.args:
        raise _fail("the function has no parameters", fn)
    return fn


def _bound_names(fn: ast.FunctionDef) -> tuple[set[str], set[str]]:
    """(names bound in the function, names bound to sequence/str literals)."""
    bound = {arg.arg for arg in fn.args.args}
    seqs: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        if isinstance(node, ast.Assign | ast.AnnAssign) and _is_seq_literal(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            seqs |= {t.id for t in targets if isinstance(t, ast.Name)}
    for name in bound:
        if name.startswith("_") or name in UNBINDABLE:
            raise _fail(f"the name {name!r} is reserved and cannot be bound")
    return bound, seqs


def _renamed(canon: str, fn: ast.FunctionDef) -> str | None:
    """Names are data: a name the function binds that is also a Python builtin or one of the
    parser's globals (`input`, `id`, `type`, `max`: relax names buffers after a model's inputs)
    is renamed, everywhere it stands, to a fresh name, so that no occurrence can resolve to the
    builtin whatever TVMScript's scoping does. A call of an allowed builtin (`max(a, b)`) keeps
    calling the builtin. The text with the names replaced, or None when nothing is renamed."""
    taken = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | {
        n.arg for n in ast.walk(fn) if isinstance(n, ast.arg)}
    bound = {a.arg for a in fn.args.args} | {
        n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    fresh: dict[str, str] = {}
    for name in sorted(bound & RESERVED_NAMES - UNBINDABLE):
        new = name + "_"
        while new in taken or new in RESERVED_NAMES:
            new += "_"
        fresh[name] = new
        taken.add(new)
    if not fresh:
        return None
    calls = {id(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
    spans: list[tuple[int, int, int, str]] = []  # (line, start, end) in UTF-8 bytes, new name
    for n in ast.walk(fn):
        if not isinstance(n, ast.Name | ast.arg):
            continue
        name = n.id if isinstance(n, ast.Name) else n.arg
        if name not in fresh or (id(n) in calls and name in ALLOWED_BUILTINS):
            continue
        spans.append((n.lineno, n.col_offset, n.col_offset + len(name.encode()), fresh[name]))
    lines = [ln.encode() for ln in canon.split("\n")]
    for line, start, end, new in sorted(spans, reverse=True):
        lines[line - 1] = lines[line - 1][:start] + new.encode() + lines[line - 1][end:]
    return "\n".join(ln.decode() for ln in lines)


def _is_seq_literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.List | ast.Tuple | ast.Dict) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str | bytes))


def _attr_chain(node: ast.Attribute) -> list[str] | None:
    """`T.axis.remap` -> ["T", "axis", "remap"]; None if not rooted at a Name."""
    parts: list[str] = []
    cur: ast.AST = node
    while isinstance(cur, ast.Attribute):
        parts.append(cur.attr)
        cur = cur.value
    if not isinstance(cur, ast.Name):
        return None
    return [cur.id, *reversed(parts)]


def _check_t_chain(chain: list[str], node: ast.AST) -> None:
    dotted = ".".join(chain)
    if len(chain) == 2 and chain[1] in T_ATTRS:
        return
    if len(chain) == 3 and chain[2] in T_SUBATTRS.get(chain[1], ()):
        return
    raise _fail(f"{dotted} is not allowed (only plain TIR constructs are)", node)


def _check_kind(node: ast.AST, fn: ast.FunctionDef) -> None:
    """First pass: node types and underscore names, before anything else looks at the tree."""
    if not isinstance(node, NODES) or (isinstance(node, ast.FunctionDef) and node is not fn):
        what = NICE.get(type(node), type(node).__name__)
        raise _fail(f"{what} not allowed in TVMScript workloads", node)
    name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
            else node.arg if isinstance(node, ast.keyword | ast.arg) else None)
    if name is not None and name.startswith("_"):
        raise _fail(f"names starting with '_' are not allowed: {name}", node)


def _check_node(node: ast.AST, bound: set[str], seqs: set[str], loop_iters: set[int]) -> None:
    """Second pass: names, attributes, calls, constants and operators."""
    if isinstance(node, ast.Name):
        if isinstance(node.ctx, ast.Load) and node.id not in bound \
                and node.id not in ALLOWED_BUILTINS and node.id != "T":
            raise _fail(f"unknown name {node.id!r} (only T, {', '.join(sorted(ALLOWED_BUILTINS))}"
                        " and names bound in the function are allowed)", node)
    elif isinstance(node, ast.Attribute):
        chain = _attr_chain(node)
        if chain is None:
            if node.attr not in VALUE_ATTRS:
                raise _fail(f"attribute .{node.attr} is not allowed", node)
        elif chain[0] == "T":
            _check_t_chain(chain, node)
        elif len(chain) > 2 or chain[1] not in VALUE_ATTRS:
            raise _fail(f"attribute {'.'.join(chain)} is not allowed (only "
                        f"{', '.join(sorted(VALUE_ATTRS))} of buffers and variables)", node)
    elif isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name):
            if f.id not in ALLOWED_BUILTINS:
                raise _fail(f"calling {f.id!r} is not allowed (only T.* functions and "
                            f"{', '.join(sorted(ALLOWED_BUILTINS))})", node)
            if f.id == "range" and id(node) not in loop_iters:  # max(range(1 << 60)) would spin
                raise _fail("range() is only allowed as the iterable of a for loop", node)
        elif not (isinstance(f, ast.Attribute) and (_attr_chain(f) or [""])[0] == "T"):
            raise _fail("only T.* functions and a few builtins may be called", node)
        for kw in node.keywords:
            if kw.arg is None:
                raise _fail("**kwargs in calls is not allowed", node)
            if kw.arg == "data":
                raise _fail("the data= keyword (buffer aliasing) is not allowed", node)
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, str) and len(v) > MAX_STRING_CHARS:
            raise _fail(f"string constants are limited to {MAX_STRING_CHARS} characters", node)
        if isinstance(v, str) and v.strip().lower().startswith("pragma"):
            # e.g. a loop annotation "pragma_import_llvm" links LLVM IR text into the module
            raise _fail(f"pragma annotations are not allowed: {v[:40]!r}", node)
        if isinstance(v, bytes | complex) or v is Ellipsis:
            raise _fail(f"{type(v).__name__} constants are not allowed", node)
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
            raise _fail("integer constant out of range", node)
    elif isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.LShift) and not (
                isinstance(node.right, ast.Constant) and isinstance(node.right.value, int)
                and 0 <= node.right.value <= 64):
            raise _fail("'<<' only by a constant between 0 and 64 (or use T.shift_left)", node)
        if any(_is_seq_literal(s) or (isinstance(s, ast.Name) and s.id in seqs)
               for s in (node.left, node.right)):
            raise _fail("operators on lists, tuples, dicts or strings are not allowed", node)


def canonical_text(text: object) -> str:
    """The one text that is vetted and parsed: CRLF and lone CR turned into LF, once. SpecError
    for any other line-breaking character and any control/format character but tab and LF,
    wherever it stands (comment, string literal or code), naming the character and its line."""
    if not isinstance(text, str):
        raise SpecError(f"must be a string of TVMScript, got {type(text).__name__}", field=FIELD)
    canon = text.replace("\r\n", "\n").replace("\r", "\n")
    bad = [c for c in set(canon) if c not in "\t\n" and (
        c in LINE_BREAKS or unicodedata.category(c) in BANNED_CATEGORIES)]
    if bad:
        pos = min(canon.index(c) for c in bad)
        c = canon[pos]
        name = CHAR_NAMES.get(c) or unicodedata.name(c, "control character").lower()
        line = canon.count("\n", 0, pos) + 1
        raise SpecError(f"line {line}: character U+{ord(c):04X} ({name}) is not allowed anywhere "
                        "in TVMScript (of the control characters only tab and the line ends LF, "
                        "CRLF and CR are)", field=FIELD)
    return canon


def _structure_and_names(text: str) -> tuple[ast.Module, ast.FunctionDef, set[str], set[str]]:
    """The first checks of `text`: limits, structure, node kinds, bound names."""
    tree = _check_limits(text)
    fn = _check_structure(tree)
    for node in ast.walk(fn):
        _check_kind(node, fn)
    bound, seqs = _bound_names(fn)
    return tree, fn, bound, seqs


def vet_tvmscript(text: object) -> str:
    """Check untrusted TVMScript; return the text to hand to the parser: the canonical text
    (`canonical_text`) whose AST was vetted, the optional import line blanked out (the parser
    supplies `T` and refuses imports). Raises SpecError."""
    canon = canonical_text(text)
    if not canon.strip():
        raise SpecError("is empty", field=FIELD)
    tree, fn, bound, seqs = _structure_and_names(canon)
    renamed = _renamed(canon, fn)
    if renamed is not None:  # vet the renamed text from the start: what is parsed is vetted
        tree, fn, bound, seqs = _structure_and_names(renamed)
        if _renamed(renamed, fn) is not None:
            raise _fail("a name the function binds could not be renamed")
        canon = renamed
    loop_iters = {id(n.iter) for n in ast.walk(fn) if isinstance(n, ast.For)}
    for node in ast.walk(fn):
        _check_node(node, bound, seqs, loop_iters)
    lines = canon.split("\n")
    first = tree.body[0]
    if _is_import_t(first):
        for i in range(first.lineno - 1, (first.end_lineno or first.lineno)):
            lines[i] = ""
    vetted = "\n".join(lines)
    # defense in depth: what the parser gets is the vetted function and nothing else
    if ast.dump(parse_python(vetted)) != ast.dump(ast.Module(body=[fn], type_ignores=[])):
        raise _fail("the text changed meaning when its import line was removed")
    return vetted


def prime_parser(texts: list[str]) -> None:
    """Parse one submitter's texts (a model's tasks) a chunk per child ahead of
    `parse_tvmscript`, which then finds them parsed (`isolate.prime`); a text the vetter
    refuses is left for `parse_tvmscript` to refuse."""
    vetted = []
    for text in texts:
        try:
            vetted.append(vet_tvmscript(text))
        except SpecError:
            continue
    prime(vetted)


def parse_tvmscript(text: object) -> PrimFunc:
    """Vet, then parse untrusted TVMScript into a PrimFunc (global_symbol set to "main") in a
    throwaway child process (results cached by content). Every failure is a
    SpecError(field="tvmscript")."""
    func = parse_isolated(vet_tvmscript(text))
    check_params(func)
    return cast("PrimFunc", func.with_attr("global_symbol", "main"))


def param_buffers(func: PrimFunc) -> list[tuple[str, list[int], str]]:
    """(name, constant shape, dtype) of every parameter; SpecError unless each one is a compact
    global T.Buffer with a constant shape. (In TVM 0.27 a PrimFunc has no buffer_map: buffer
    parameters are Vars whose type is a BufferType.)"""
    from ..core.tvm_api import (
        buffer_dtype,
        buffer_elem_offset,
        buffer_shape,
        buffer_strides,
        const_shape,
        func_params,
        tvm,
    )

    out = []
    for p in func_params(func):
        if not isinstance(getattr(p, "ty", None), tvm.tirx.BufferType):
            raise SpecError(f"parameter {p.name} is not a buffer: every parameter must be a "
                            "T.Buffer with a constant shape", field=FIELD)
        if not all(isinstance(d, tvm.tirx.IntImm) for d in buffer_shape(p)):
            raise SpecError(f"buffer {p.name} has a symbolic shape {list(buffer_shape(p))}; "
                            "shapes must be constants", field=FIELD)
        if len(buffer_strides(p)) or not (
                isinstance(off := buffer_elem_offset(p), tvm.tirx.IntImm) and int(off) == 0) \
                or p.scope() != "global":  # type: ignore[attr-defined]
            raise SpecError(f"buffer parameter {p.name} must be compact (no strides, no "
                            "elem_offset, global scope)", field=FIELD)
        out.append((str(p.name), const_shape(p), str(buffer_dtype(p))))
    return out


def check_dims(name: str, dims: list[int], limit: int) -> None:
    """SpecError when one dimension of buffer `name` is past `limit` (max_tensor_elements),
    whatever the others: a (0, 2**40) buffer holds nothing, and indexes far."""
    for d in dims:
        if d > limit:
            raise SpecError(f"buffer {name} {dims} has a dimension of {d}; the limit "
                            f"(max_tensor_elements) is {limit}", field=FIELD)


def check_params(func: PrimFunc) -> None:
    limit = get_settings().max_tensor_elements
    for name, dims, _ in param_buffers(func):
        check_dims(name, dims, limit)
        n = math.prod(dims)
        if n > limit:
            raise SpecError(f"buffer {name} {dims} has {n} elements; the limit "
                            f"(max_tensor_elements) is {limit}", field=FIELD)

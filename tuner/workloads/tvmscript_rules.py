"""The allowlists used by `tvmscript.py` to vet untrusted TVMScript (see its docstring)."""

from __future__ import annotations

import ast
import builtins

FIELD = "tvmscript"
MAX_AST_DEPTH = 64
MAX_STRING_CHARS = 128
MAX_INT = 2**63
MAX_VECTORIZED_EXTENT = 64  # lanes of one T.vectorized loop
MAX_UNROLL_EXTENT = 256  # iterations of one T.unroll loop (code size of the build)
MAX_UNROLLED_COPIES = 4096  # copies of a body under nested T.unroll loops (their product)

# every character str.splitlines() breaks at (besides "\n"; "\r" and "\r\n" are normalised to
# "\n"): Python's tokenizer treats them as ordinary characters inside comments and strings
LINE_BREAKS = frozenset("\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
# refused anywhere in a text (tab and "\n" excepted): control, format (bidi overrides,
# zero-width), line/paragraph separators, lone surrogates
BANNED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
CHAR_NAMES = {"\x00": "NUL", "\v": "vertical tab", "\f": "form feed", "\r": "carriage return",
              "\x1c": "file separator", "\x1d": "group separator",
              "\x1e": "record separator", "\x1f": "unit separator", "\x7f": "delete",
              "\x85": "next line", "\x1b": "escape"}

ALLOWED_BUILTINS = frozenset({"range", "len", "min", "max", "int", "float"})
# names the parser puts in scope (tvm.script.parser.core.entry._default_globals) plus all builtins:
# a function binding one of them has it renamed (`tvmscript._renamed`)
RESERVED_NAMES = frozenset(dir(builtins)) | {
    "T", "tvm", "I", "ir", "tir", "R", "relax", "Tx", "tirx", "Axis", "TypeVar"}
# `T` roots every construct of the dialect: a function binding it is refused, never renamed
UNBINDABLE = frozenset({"T"})

_DTYPES = [f"{k}{b}" for k, bits in (("float", (16, 32, 64)), ("int", (8, 16, 32, 64)),
                                     ("uint", (8, 16, 32, 64))) for b in bits]
T_ATTRS = frozenset({
    # structure
    "prim_func", "Buffer", "handle", "match_buffer", "func_attr", "grid", "serial", "parallel",
    "vectorized", "unroll", "sblock", "axis", "init", "reads", "writes", "sblock_attr", "where",
    "sblock_alloc_buffer", "alloc_buffer", "evaluate", "Assert",
    # dtypes and casts
    *_DTYPES, "bool", "f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
    "cast", "Cast", "max_value", "min_value", "infinity",
    # math
    "abs", "fabs", "exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "sigmoid", "tanh", "sin", "cos", "tan", "sinh", "cosh", "asin", "acos", "atan", "atan2",
    "asinh", "acosh", "atanh", "erf", "pow", "floor", "ceil", "round", "trunc", "nearbyint",
    "fma", "fmod", "hypot", "copysign", "isnan", "isinf", "isfinite", "max", "min",
    "if_then_else", "Select", "floordiv", "floormod", "truncdiv", "truncmod", "ceildiv", "likely",
    "clz", "popcount", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "shift_left",
    "shift_right", "q_multiply_shift",
})
T_SUBATTRS = {"axis": frozenset({"remap", "spatial", "reduce", "S", "R", "opaque", "scan"})}
# attributes readable on names bound by the function (buffers, loop variables)
VALUE_ATTRS = frozenset({"shape", "dtype", "ndim"})
DECORATOR_KWARGS = frozenset({"s_tir"})

NODES: tuple[type, ...] = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.For, ast.If, ast.With, ast.withitem,
    ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Pass, ast.Assert,
    ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.keyword, ast.Attribute,
    ast.Subscript, ast.Slice, ast.Name, ast.Constant, ast.Tuple, ast.List, ast.Dict, ast.IfExp,
    ast.Load, ast.Store,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.LShift, ast.RShift,
    ast.BitOr, ast.BitXor, ast.BitAnd, ast.And, ast.Or, ast.Not, ast.Invert, ast.UAdd, ast.USub,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
)
NICE = {  # how rejected node types are named in error messages
    ast.Lambda: "lambda", ast.ListComp: "comprehensions", ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions", ast.GeneratorExp: "generator expressions",
    ast.Import: "imports", ast.ImportFrom: "imports", ast.Global: "global",
    ast.Nonlocal: "nonlocal", ast.ClassDef: "classes", ast.AsyncFunctionDef: "async",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.Try: "try",
    ast.Raise: "raise", ast.Delete: "del", ast.Starred: "starred arguments",
    ast.NamedExpr: "assignment expressions", ast.JoinedStr: "f-strings",
    ast.Pow: "'**' (use T.pow)", ast.While: "while loops (use a for loop with a constant extent)",
    ast.Return: "return", ast.FunctionDef: "nested functions", ast.Set: "sets",
}

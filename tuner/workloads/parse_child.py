"""The child process of `isolate.parse_isolated`: parse one untrusted TVMScript text.

    python -m tuner.workloads.parse_child [--limits=JSON] [--drop=USER]  < {"texts": [...],
                                   "max_tvmscript_bytes": ..., "max_tvmscript_nodes": ...}
    -> one JSON line on stdout: {"results": [one per text: {"ok": true, "json": <tvm.ir.save_json
                                 of the PrimFunc>} or {"ok": false, "error": <message>}]}

Several texts are one submitter's (a model's tasks: `isolate.prime`).

It starts in a session of its own with a clean environment, applies the parent's limits
(`--limits`: address space, CPU, file size, niceness, no network, the unprivileged user) to
itself first thing, before it imports or reads anything.
With `--drop=USER` (the interpreter lives where that user cannot read) it imports TVM and warms
the parser up on a fixed function first, then drops to USER, and only then reads the text. It
vets the text again (`vet_tvmscript`, the parent's size limits) and parses exactly the vetted
text. Anything written to stdout by TVM goes to stderr: the reply has stdout to itself.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

_WARM_UP = ('@T.prim_func\ndef f(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):\n'
            '    for i in range(4):\n        B[i] = A[i] * T.float32(2)\n')


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Vet and parse `request["text"]`; the reply for the parent."""
    from ..core.config import get_settings
    from ..core.errors import SpecError
    from ..core.tvm_api import prim_func_from_tvmscript, save_json
    from .isolate import parser_error
    from .tvmscript import vet_tvmscript

    settings = get_settings()
    for name in ("max_tvmscript_bytes", "max_tvmscript_nodes"):
        if isinstance(request.get(name), int):
            setattr(settings, name, request[name])
    try:
        vetted = vet_tvmscript(request.get("text"))
    except SpecError as exc:
        return {"ok": False, "error": str(exc.args[0] if exc.args else exc)}
    if vetted != request.get("text"):  # the parent sends vetted text: it must come back unchanged
        return {"ok": False, "error": "the text to parse is not in its vetted form"}
    try:
        func = prim_func_from_tvmscript(vetted)
    except Exception as exc:  # DiagnosticError, TypeError, ValueError, ... from the parser
        return {"ok": False, "error": parser_error(exc, vetted)}
    return {"ok": True, "json": save_json(func)}


def main(argv: list[str]) -> int:
    limits = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--limits=")]
    if limits:  # the parent's limits, before anything is imported or read
        from ..core.isolation import Limits

        Limits.from_json(limits[0]).apply_here()
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # TVM's prints (and anything else) go to stderr
    sys.stdout = sys.stderr
    from ..core.tvm_api import prim_func_from_tvmscript, save_json

    drop = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--drop=")]
    if drop:  # started as root with the limits set: imports and lazy imports first, then no root
        save_json(prim_func_from_tvmscript(_WARM_UP))
        handle({"text": _WARM_UP.replace("* T.float32(2)", "* q")})  # the error path too
        from ..core.isolation import Limits

        Limits(memory_mb=None, cpu_s=None, fsize_mb=None, user=drop[0]).drop_now()
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    request = request if isinstance(request, dict) else {}
    texts = request.get("texts")
    reply = {"results": [handle({**request, "text": t})
                         for t in (texts if isinstance(texts, list) else [])]}
    with os.fdopen(reply_fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

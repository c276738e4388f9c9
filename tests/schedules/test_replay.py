"""A stored trace replays in any process: build and measuring processes import no template and
register only the tensor intrinsics a trace names (schedules.registry.replay)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from schedules import registry
from tuner.core import tvm_api as tv
from tuner.workloads import parse_spec

ZEN = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
# every template that tensorizes, with a workload and a target it serves
TENSORIZING = [
    ("softmax-x86", {"op": "softmax", "shape": [8, 64]}, ZEN),
    ("dense-int8-vnni", {"op": "dense_int8", "shape": [16, 64, 32]}, ZEN),
    ("dense-int8-avx2", {"op": "dense_int8", "shape": [16, 64, 32]},
     {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}),
    ("dense-int8-sdot-aarch64", {"op": "dense_int8", "shape": [8, 32, 64]},
     {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1",
      "mattr": ["+neon", "+dotprod", "+i8mm"]}),
    ("dense-wmma-cuda", {"op": "dense", "shape": [64, 64, 32], "dtype": "float16"},
     {"kind": "cuda", "arch": "sm_80", "host": {"kind": "llvm"}}),
]

CHILD = """
import json, sys
from schedules.registry import replay
from tuner.core import tvm_api as tv
from tuner.workloads import parse_spec

out = []
for case in json.load(open(sys.argv[1])):
    out.append(tv.structural_hash(replay(parse_spec(case["spec"]).mod(), case["trace"]).mod))
assert "schedules.families" not in sys.modules, "replay imported the templates"
print(json.dumps(out))
"""


def _trace(name: str, spec: dict[str, Any], target: dict[str, Any]) -> tuple[str, str]:
    wl = parse_spec(spec)
    tmpl = registry.TEMPLATES[name]
    assert tmpl.applies(wl, tv.make_target(target)), name
    sch = tv.Schedule(wl.mod(), seed=3)
    tmpl.apply(sch, wl, tv.make_target(target))
    return tv.trace_to_json(sch.trace), tv.structural_hash(sch.mod)


def test_tensorized_traces_replay_in_a_fresh_process(tmp_path: Path) -> None:
    registry.space_names()  # loads the templates in this process
    cases, expected = [], []
    for name, spec, target in TENSORIZING:
        trace, digest = _trace(name, spec, target)
        assert "Tensorize" in trace or "auto_tensorize" in trace, name
        cases.append({"spec": spec, "trace": trace})
        expected.append(digest)
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(cases))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                          text=True, timeout=240, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected


EDITED_UNDER_A_WORKER = """
import importlib.util, linecache, shutil, sys
src, path = sys.argv[1], sys.argv[2]
shutil.copy(src, path)
spec = importlib.util.spec_from_file_location("intrinsics_copy", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
with open(path) as f:
    text = f.read()
with open(path, "w") as f:  # an upgrade on disk shifts every line
    f.write("# one\\n# two\\n# three\\n" + text)
mod.use(mod.EXP_SUB_F32.format(lanes=16))  # parsed from the source as imported
linecache.cache.pop(path)  # without the pin, the parse reads the new file
try:
    mod.use(mod.EXP_SUB_F32.format(lanes=8))
    print("unpinned parse worked")
except Exception as exc:
    print("unpinned parse failed:", type(exc).__name__)
"""


def test_intrinsics_parse_the_source_as_imported(tmp_path: Path) -> None:
    """A long-running worker parses an intrinsic when it first needs it: an upgrade of the file
    on disk since its import must not change what it parses."""
    from schedules import intrinsics

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", EDITED_UNDER_A_WORKER, intrinsics.__file__,
                           str(tmp_path / "intrinsics_copy.py")],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the hazard is real: the same parse without the pinned source fails
    assert "unpinned parse failed" in proc.stdout, proc.stdout

"""`python -m tuner.core.lean MODULE ARGS`: children run their module without torch, whatever is
installed, and see their own arguments (real processes)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tuner.core import lean, zygote
from tuner.core.isolation import child_env
from tuner.measure.local import LocalMeasurer

ROOT = Path(__file__).resolve().parents[2]

PROBE = """\
import json, sys
from tuner.core import tvm_api  # imports tvm, whose tvm_ffi tries `import torch`
try:
    import torch  # noqa: F401
    loaded = True
except ImportError:
    loaded = False
print(json.dumps({"torch": loaded, "argv": sys.argv[1:], "name": __name__}))
"""


def _run(argv: list[str], tmp_path: Path) -> dict:
    (tmp_path / "probe_child.py").write_text(PROBE)
    env = child_env({"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    out = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _forked(module: str, tmp_path: Path, *args: str, idle: bool = False) -> dict:
    """`module` run as a child of the fork server (`tuner.core.zygote`), from `tmp_path`."""
    env = child_env({"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    proc = zygote.popen(module, *args, idle=idle, env=env, cwd=tmp_path,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert isinstance(proc, zygote.ZygotePopen)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (proc.returncode, out, err)
    return json.loads(out.decode().strip().splitlines()[-1])


def test_a_lean_child_runs_its_module_without_torch(tmp_path: Path) -> None:
    got = _run(lean.argv("probe_child", "7", "--drop=nobody"), tmp_path)
    assert got == {"torch": False, "argv": ["7", "--drop=nobody"], "name": "__main__"}
    assert _forked("probe_child", tmp_path, "7", "--drop=nobody") == got


SCHED_PROBE = """\
import json, os
print(json.dumps({"idle": os.sched_getscheduler(0) == os.SCHED_IDLE,
                  "autogroup": open("/proc/self/autogroup").read().split()}))
"""


def test_an_idle_child_yields_the_cpu_from_its_first_import(tmp_path: Path) -> None:
    """A parse child (`idle=True`) runs in the idle class, and its session's autogroup (it
    leads a session of its own) at the lowest weight, before its module's package imports
    anything; a plain lean child does neither."""
    (tmp_path / "sched_child.py").write_text(SCHED_PROBE)
    env = child_env({"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})

    def run(idle: bool) -> dict:
        out = subprocess.run(lean.argv("sched_child", idle=idle), env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=60, check=True,
                             start_new_session=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    for idle, plain in ((run(True), run(False)),
                        (_forked("sched_child", tmp_path, idle=True),
                         _forked("sched_child", tmp_path))):
        assert idle["idle"] and idle["autogroup"][-1] == "19", idle
        assert not plain["idle"] and plain["autogroup"][-1] == "0", plain


def test_the_tvmscript_parser_starts_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.workloads import isolate

    started: list[tuple[str, bool]] = []
    popen = zygote.popen

    def spy(module: str, *args: str, idle: bool = False, **kw: Any) -> Any:
        started.append((module, idle))
        return popen(module, *args, idle=idle, **kw)

    monkeypatch.setattr(isolate.zygote, "popen", spy)
    isolate._parse_in_child(["not tvmscript"])
    assert started == [(isolate.CHILD_MODULE, True)]


def test_without_lean_torch_is_whatever_is_installed(tmp_path: Path) -> None:
    """The control: the same module started plainly imports torch when torch is installed
    (this environment's answer, whatever it is, comes from the same probe)."""
    import importlib.util

    got = _run([sys.executable, "-m", "probe_child"], tmp_path)
    assert got["torch"] is (importlib.util.find_spec("torch") is not None)


def test_the_sandbox_and_build_processes_start_lean(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawned (fork_server off): their command lines; forked from the fork server: the
    server's, and no torch library mapped in the sandbox, the build process or the server."""
    from tuner.core.config import get_settings

    monkeypatch.setenv("TUNEFARM_FORK_SERVER", "0")
    get_settings.cache_clear()
    try:
        with LocalMeasurer(build_workers=1) as m:
            child = m._start_child(1)
            cmdline = Path(f"/proc/{child.proc.pid}/cmdline").read_bytes().split(b"\0")
            assert cmdline[1:4] == [b"-m", b"tuner.core.lean", b"tuner.measure.sandbox"]
            child.wait_ready()
            want = [b"-m", b"tuner.core.lean", b"tvm.exec.popen_worker"]
            deadline = time.monotonic() + 60  # the pool starts its process from a thread
            while not any(c[1:4] == want for c in _children()):
                assert time.monotonic() < deadline, _children()
                time.sleep(0.2)
    finally:
        get_settings.cache_clear()
    monkeypatch.delenv("TUNEFARM_FORK_SERVER")
    get_settings.cache_clear()
    with LocalMeasurer(build_workers=1) as m:
        child = m._start_child(1)
        assert isinstance(child.proc, zygote.ZygotePopen)
        server = zygote._get_server()
        assert server is not None and _parent(Path(f"/proc/{child.proc.pid}")) == server.proc.pid
        child.wait_ready()
        deadline = time.monotonic() + 60
        while len(forked := _children(server.proc.pid)) < 2:  # the sandbox and a build process
            assert time.monotonic() < deadline, forked
            time.sleep(0.2)
        for pid in (server.proc.pid, *_children_pids(server.proc.pid)):
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert "libtorch" not in maps and "libtvm" in maps, pid


def _children(parent: int | None = None) -> list[list[bytes]]:
    """The command lines of the children of `parent` (this process)."""
    out = []
    for pid in _children_pids(parent):
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
    return out


def _children_pids(parent: int | None = None) -> list[int]:
    want = os.getpid() if parent is None else parent
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and _parent(p) == want]


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


CLI_PROBE = """\
import json, sys
sys.argv = ["tunefarm", *json.loads(sys.argv[1])]
from tuner.cli import main
try:
    main()
except SystemExit:
    pass
torch = sys.modules.get("torch", "absent")
print(json.dumps({"blocked": torch is None, "tvm": "tvm" in sys.modules}))
"""


def _cli(args: list[str], tmp_path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNEFARM_DATA_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", CLI_PROBE, json.dumps(args)], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cli_commands_that_read_no_model_run_without_torch(tmp_path: Path) -> None:
    """`tunefarm spaces` imports TVM (whose tvm_ffi would import torch) with torch blocked;
    `tunefarm build` (a model file may need torch) leaves torch importable."""
    assert _cli(["spaces", "dense"], tmp_path) == {"blocked": True, "tvm": True}
    assert _cli(["build", "--help"], tmp_path)["blocked"] is False


def test_which_commands_need_torch() -> None:
    from tuner.cli import needs_torch

    assert needs_torch(["tune-model", "m.pt2"]) and needs_torch(["build", "m.py"])
    assert needs_torch(["--help", "build"])
    assert not needs_torch(["tune", "tir", "--tvmscript", "build"])  # a file named like a command
    assert not needs_torch(["db", "export"]) and not needs_torch([])

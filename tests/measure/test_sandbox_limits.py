"""The sandbox is locked (issue 10): the measuring child gets no TUNEFARM_* variable, runs as the
unprivileged user when the tests run as root, has an address-space limit that turns a huge
allocation into a recorded run_error naming the limit (and the next candidate still measures),
and refuses a built library whose bytes no longer match their sha256 (built, as every build
process builds, by the unprivileged user)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernels import ALLOC
from tests.support.targets import RUN_X86
from tuner.core import tvm_api as tv
from tuner.core.config import get_settings
from tuner.core.isolation import Limits, child_env
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.measure.local import LocalMeasurer
from tuner.workloads import parse_spec

MATMUL = {"op": "matmul", "shape": [64, 64, 64]}
HUGE = {"op": "matmul", "shape": [8192, 8192, 64]}  # 256 MiB per copy of the output


def _inp(spec: dict, trial: str) -> MeasureInput:
    wl = parse_spec(spec)
    opts = MeasureOptions(min_repeat_ms=5, repeats=3, num_threads=1, run_timeout_s=60.0,
                          build_timeout_s=60.0)
    return MeasureInput(trial_id=trial, workload_key=wl.key, workload_spec=wl.spec,
                        target=RUN_X86, trace_json=tv.trace_to_json(tv.Schedule(wl.mod()).trace),
                        options=opts)


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TUNEFARM_TOKEN", "secret")
    monkeypatch.setenv("TUNEFARM_DATABASE_URL", "postgresql://u:p@db/x")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _proc(pid: int, name: str) -> str:
    return Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace")


def test_spawned_child_sees_no_tunefarm_variable(secret_env: None) -> None:
    limits = Limits.from_settings()
    if not limits.can_exec(sys.executable):  # a Python under root's home: see Limits.drop_now
        limits = limits.keep_root()
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.environ))"], env=child_env(),
        preexec_fn=limits.preexec(), capture_output=True, text=True,
        check=True, cwd="/")
    assert "TUNEFARM" not in out.stdout
    with pytest.raises(ValueError):
        child_env({"TUNEFARM_TOKEN": "x"})


def test_sandbox_child_env_and_user(secret_env: None) -> None:
    with LocalMeasurer(build_workers=0) as m:
        child = m._ensure_child(1)
        pid = child.proc.pid
        env = _proc(pid, "environ").split("\0")
        assert not [e for e in env if e.startswith("TUNEFARM_")], env
        assert "secret" not in "".join(env)
        uid = int(next(ln for ln in _proc(pid, "status").splitlines()
                       if ln.startswith("Uid:")).split()[1])
        if os.geteuid() == 0 and Limits.from_settings().drop_ids() is not None:
            assert uid == pwd.getpwnam(get_settings().sandbox_user).pw_uid != 0
        else:
            assert uid == os.geteuid()
        ok = m.measure_one(_inp(MATMUL, "t-ok"))  # the dropped child still builds and runs
        assert ok.invalidity is Invalidity.OK, ok.error_msg


@pytest.mark.parametrize("spec, limit_mb", [(HUGE, 1024), ({"op": "tir", "tvmscript": ALLOC}, 768)],
                         ids=["huge-arguments", "kernel-allocates"])
def test_allocation_past_the_limit_is_a_run_error(monkeypatch: pytest.MonkeyPatch,
                                                  spec: dict, limit_mb: int) -> None:
    """Past the address-space limit: the workload's arguments (a huge matmul), or the kernel's
    own scratch buffer (a `tir` kernel allocating 512 MiB when it runs; a measuring child
    takes about 550 MiB of address space before it)."""
    monkeypatch.setenv("TUNEFARM_SANDBOX_MEMORY_MB", str(limit_mb))
    get_settings.cache_clear()
    try:
        with LocalMeasurer(build_workers=0) as m:
            big = m.measure_one(_inp(spec, "t-huge"))
            assert big.invalidity is Invalidity.RUN_ERROR, big
            assert f"{limit_mb} MiB" in (big.error_msg or ""), big.error_msg
            after = m.measure_one(_inp(MATMUL, "t-after"))
            assert after.invalidity is Invalidity.OK, after.error_msg
    finally:
        get_settings.cache_clear()


def test_tampered_artifact_is_refused() -> None:
    with LocalMeasurer(build_workers=1) as m:
        inp = _inp(MATMUL, "t-tamper")
        m.prepare([inp])
        built = m._built[inp.trial_id]
        assert built.path and built.sha256
        ids = Limits.from_settings().drop_ids()  # the build process ran unprivileged too
        assert os.stat(built.path).st_uid == (ids[0] if ids else os.geteuid())
        with open(built.path, "ab") as f:
            f.write(b"\0evil")
        res = m.measure_one(inp)
        assert res.invalidity is Invalidity.BUILD_ERROR
        assert "hash mismatch" in (res.error_msg or ""), res.error_msg
        good = _inp(MATMUL, "t-good")
        m.prepare([good])
        res = m.measure_one(good)
        assert res.invalidity is Invalidity.OK, res.error_msg


def test_an_untrusted_child_reaches_no_network() -> None:
    """Started as root, a child (parse, build or run) gets a network namespace of its own: a
    server listening on the host's loopback is out of its reach; the same child without the
    namespace (the control) connects."""
    import socket
    import textwrap

    if os.geteuid() != 0:
        pytest.skip("network namespaces need root; without it children share the network")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        probe = textwrap.dedent(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
                print("connected")
            except OSError as exc:
                print("refused", exc.errno)
            """)
        outs = {}
        for offline in (True, False):
            limits = Limits.from_settings(offline=offline)
            if not limits.can_exec(sys.executable):
                limits = limits.keep_root()
            outs[offline] = subprocess.run(
                [sys.executable, "-c", probe], env=child_env(), preexec_fn=limits.preexec(),
                capture_output=True, text=True, timeout=60, cwd="/").stdout.strip()
    assert outs[False] == "connected", outs
    assert outs[True].startswith("refused"), outs

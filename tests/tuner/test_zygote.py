"""The fork server (`tuner.core.zygote`): a child forked from it is what a spawned lean child
would be (its descriptors and nothing else, its environment, its limits, its exit status), the
server holds nothing of its client's, and it goes when its client goes (real processes)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.core import zygote
from tuner.core.isolation import Limits, child_env

ROOT = Path(__file__).resolve().parents[2]

PROBE = """\
import json, os, resource, sys
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
if len(sys.argv) > 1 and sys.argv[1] == "write":
    os.write(int(sys.argv[2]), b"through the passed descriptor")
if len(sys.argv) > 1 and sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
if len(sys.argv) > 1 and sys.argv[1] == "sleep":
    import time; print("sleeping", flush=True); time.sleep(60)
print(json.dumps({"argv": sys.argv[1:], "fds": fds, "cwd": os.getcwd(),
                  "env": dict(os.environ), "environ": open("/proc/self/environ").read(),
                  "as": resource.getrlimit(resource.RLIMIT_AS)[0],
                  "sid": os.getsid(0) == os.getpid(), "stdin": sys.stdin.read()}))
"""


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    (tmp_path / "zprobe.py").write_text(PROBE)
    return tmp_path


def _start(cwd: Path, *args: str, **kw: object) -> subprocess.Popen[bytes]:
    kw.setdefault("env", child_env())
    proc = zygote.popen("zprobe", *args, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, **kw)  # type: ignore[arg-type]
    assert isinstance(proc, zygote.ZygotePopen)
    return proc


def test_a_forked_child_gets_its_descriptors_environment_and_limits_and_nothing_else(
        probe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEFARM_TOKEN", "client-secret")  # the client's, never the child's
    r, w = os.pipe()
    try:
        limits = Limits(memory_mb=3072, cpu_s=None, fsize_mb=None, user="")
        proc = _start(probe, "write", str(w), pass_fds=(w,), limits=limits,
                      env=child_env({"MARK": "mine"}))
        out, err = proc.communicate(b"to stdin", timeout=60)
        assert proc.returncode == 0, err
        got = json.loads(out)
        assert os.read(r, 100) == b"through the passed descriptor"
    finally:
        os.close(r)
        os.close(w)
    # 0-2, the passed descriptor at its own number, and the probe's listing of /proc/self/fd
    assert got["fds"][:3] == [0, 1, 2] and w in got["fds"] and len(got["fds"]) == 5, got["fds"]
    assert got["stdin"] == "to stdin" and got["cwd"] == str(probe)
    assert got["env"]["MARK"] == "mine" and "TUNEFARM_TOKEN" not in got["env"]
    assert "client-secret" not in got["environ"]  # the server's own start-up environment
    assert got["as"] == 3072 << 20 and got["sid"]  # the limits, and a session of its own
    server = zygote._get_server()
    assert server is not None
    assert b"client-secret" not in Path(f"/proc/{server.proc.pid}/environ").read_bytes()


def test_exit_codes_signals_poll_and_kill_read_as_for_a_spawned_child(probe: Path) -> None:
    proc = _start(probe, "exit", "3")
    proc.communicate(timeout=60)
    assert proc.returncode == 3
    proc = _start(probe, "sleep", start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == b"sleeping\n"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # as the sandbox's owner kills it: by its group
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.communicate()
    proc = _start(probe, "sleep")
    proc.terminate()
    assert proc.wait(timeout=30) == -signal.SIGTERM
    proc.communicate()


def test_the_server_goes_with_its_client_and_a_lost_server_is_replaced(probe: Path) -> None:
    client = subprocess.run(
        [sys.executable, "-c", "import json, subprocess; from tuner.core import zygote\n"
         "p = zygote.popen('json.tool', stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
         "out, _ = p.communicate(b'[1]')\n"
         "print(json.dumps([zygote._servers[False].proc.pid, p.returncode, out.decode()]))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    server_pid, code, out = json.loads(client.stdout.strip().splitlines()[-1])
    assert code == 0 and json.loads(out) == [1]
    deadline = time.monotonic() + 30
    while Path(f"/proc/{server_pid}").exists() and _state(server_pid) != "Z":
        assert time.monotonic() < deadline, "the fork server outlived its client"
        time.sleep(0.1)

    proc = _start(probe, "sleep")  # a child of a server that is then lost
    server = zygote._get_server()
    assert server is not None
    server.proc.kill()
    server.proc.wait(timeout=30)
    assert proc.wait(timeout=30) == -signal.SIGKILL  # reported killed, and killed
    deadline = time.monotonic() + 10
    while _state(proc.pid) not in ("Z", "gone"):
        assert time.monotonic() < deadline, "the lost server's child still runs"
        time.sleep(0.1)
    proc.communicate(timeout=10)
    again = _start(probe, "exit", "0")
    again.communicate(timeout=60)
    assert again.returncode == 0 and zygote._get_server() is not server


def test_with_fork_server_off_a_child_is_spawned(probe: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.core.config import get_settings

    monkeypatch.setenv("TUNEFARM_FORK_SERVER", "0")
    get_settings.cache_clear()
    try:
        limits = Limits(memory_mb=2048, cpu_s=None, fsize_mb=None, user="")
        proc = zygote.popen("zprobe", cwd=probe, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=child_env({"PYTHONPATH": f"{probe}{os.pathsep}{ROOT}"}),
                            limits=limits)
        out, _ = proc.communicate(b"", timeout=120)
    finally:
        get_settings.cache_clear()
    assert type(proc) is subprocess.Popen and proc.returncode == 0
    got = json.loads(out)
    assert got["as"] == 2048 << 20 and got["sid"]
    assert resource.getrlimit(resource.RLIMIT_AS)[0] != 2048 << 20  # not this process's


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def test_idle_children_come_from_a_server_in_the_idle_class(probe: Path) -> None:
    """The API's parse children run in the idle class from their first import; their server
    too (its start-up imports TVM while the API serves), and the other server does not."""
    for idle in (True, False):
        proc = _start(probe, "exit", "0", idle=idle)
        proc.communicate(timeout=60)
        server = zygote._get_server(idle)
        assert proc.returncode == 0 and server is not None
        assert (os.sched_getscheduler(server.proc.pid) == os.SCHED_IDLE) is idle
    assert zygote._get_server(True) is not zygote._get_server(False)

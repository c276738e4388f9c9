"""A process holding credentials (worker, tuner) makes itself non-dumpable: a process of the same
user, such as a sandbox child when the worker does not run as root, cannot read its environment
(`/proc/<pid>/environ`). Real processes, both run as the unprivileged sandbox user, as a worker
that does not run as root would be."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

import pytest

from tuner.core.isolation import Limits

# the "worker": drops to the unprivileged user (as the sandbox's late drop does: that user may
# not reach this interpreter's files, so it starts as root and drops once imported), holds a
# secret in its environment, maybe calls undumpable(), then forks a child (its own user) that
# tries to read the worker's environment
PARENT = r"""
import os, sys
from tuner.core.isolation import Limits, undumpable
Limits(memory_mb=None, cpu_s=None, nproc=None, fsize_mb=None).drop_now()
assert os.geteuid() != 0
if sys.argv[1] == "protect":
    assert undumpable()
else:  # as a worker exec'd as this user would be (dropping from root made us non-dumpable)
    import ctypes
    assert ctypes.CDLL(None).prctl(4, 1, 0, 0, 0) == 0
parent = os.getpid()
pid = os.fork()
if pid == 0:
    try:
        data = open(f"/proc/{parent}/environ", "rb").read()
        print("read", b"TUNEFARM_TOKEN=tf_secret" in data, flush=True)
    except PermissionError:
        print("denied", flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("mode, expected", [("protect", "denied"), ("open", "read True")])
def test_a_process_of_the_same_user_cannot_read_a_protected_environment(mode: str,
                                                                        expected: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to start the processes as another user")
    try:
        pwd.getpwnam(Limits().user)
    except KeyError:
        pytest.skip(f"no user {Limits().user!r} to run the processes as")
    env = {"PATH": os.environ.get("PATH", ""), "TUNEFARM_TOKEN": "tf_secret",
           "PYTHONPATH": os.getcwd(), "HOME": "/tmp"}
    out = subprocess.run([sys.executable, "-c", PARENT, mode], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == expected  # "open": the control shows the read would work

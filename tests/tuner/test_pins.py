"""The ffi pin is load-bearing: apache-tvm-ffi 0.1.15.x segfaults in tvm.ir.save_json."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from tuner.core import tvm_api
from tuner.core.errors import EnvironmentMismatch


def test_installed_versions_match_the_pins() -> None:
    assert importlib.metadata.version("apache-tvm-ffi") == "0.1.14.post1"
    assert importlib.metadata.version("apache-tvm") == "0.27.0.post1"


def test_another_ffi_version_is_refused_with_the_fix() -> None:
    fake = {"apache-tvm": "0.27.0.post1", "apache-tvm-ffi": "0.1.15.post2"}
    with pytest.raises(EnvironmentMismatch, match=r"apache-tvm-ffi==0\.1\.15\.post2.*pip install"):
        tvm_api.check_pins(version=fake.__getitem__)


def test_missing_tvm_is_refused() -> None:
    def version(dist: str) -> str:
        raise importlib.metadata.PackageNotFoundError(dist)

    with pytest.raises(EnvironmentMismatch, match="not installed"):
        tvm_api.check_pins(version=version)


def test_save_json_round_trips_in_a_fresh_process() -> None:
    # the call that segfaults (exit code 139) with the wrong ffi version
    code = (
        "from tuner.core.tvm_api import te, tvm, save_json, load_json, structural_equal\n"
        "A = te.placeholder((8,), name='A'); B = te.compute((8,), lambda i: A[i] * 2.0, name='B')\n"
        "mod = tvm.IRModule({'main': te.create_prim_func([A, B])})\n"
        "assert structural_equal(load_json(save_json(mod)), mod)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"

"""`tuner.core.ffi_names`: TVM's global function names listed once per change, the same list."""

from __future__ import annotations

import uuid


def test_the_kept_listing_is_the_registrys_own_and_follows_registrations_and_removals() -> None:
    from tuner.core import ffi_names
    from tuner.core.tvm_api import tvm_ffi  # the seam installs it before TVM is imported

    registry = tvm_ffi.registry
    listing = registry.list_global_func_names
    assert getattr(listing, "_tunefarm_cached", False)
    original = listing.__wrapped__
    ffi_names.install(tvm_ffi)  # idempotent: still the one wrapper
    assert registry.list_global_func_names is listing
    assert listing() == original() and len(listing()) > 1000

    base = f"tunefarm.test.ffi_names_{uuid.uuid4().hex}"
    tvm_ffi.register_global_func(base + "_a", lambda: 1)
    assert base + "_a" in listing() and listing() == original()
    # a removal then a registration leave the count as it was: the listing still sees both
    tvm_ffi.remove_global_func(base + "_a")
    tvm_ffi.register_global_func(base + "_b", lambda: 2)
    names = listing()
    assert base + "_b" in names and base + "_a" not in names and names == original()
    registry.remove_global_func(base + "_b")
    assert base + "_b" not in listing() and listing() == original()
    # the caller's copy is its own
    listing().clear()
    assert listing() == original()


def test_tvms_ffi_modules_have_their_functions() -> None:
    from tuner.core.tvm_api import tvm

    # two of the ~50 modules `init_ffi_api` filled from the kept listing at import
    assert callable(tvm.ir._ffi_api.DebugPrint)
    assert callable(tvm.target._ffi_api.Target)

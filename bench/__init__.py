"""tunefarm's benchmark harness: `python -m bench --suite public --trials 64` (see README.md).

Nothing is imported here: `bench.__main__` must set the thread variables (TVM_NUM_THREADS,
OPENBLAS_NUM_THREADS, ...) before numpy or TVM is loaded.
"""

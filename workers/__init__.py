"""tunefarm workers: the measurement agents (build, run, verify, time, report).

`workers.local` measures on this machine in a sandbox child process (`workers.sandbox`).
"""

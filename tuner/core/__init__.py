"""The core layer: what every other part of tunefarm builds on (pyproject.toml,
`[tool.tunefarm.layers]`). `tvm_api` is the one module that imports TVM; `errors`, `config`,
`logs`, `signals`, `isolation`, `lean`, `telemetry`, `liveness` are the process plumbing;
`targets` checks target dicts; `prepack` splits a kernel from its weight packing;
`measurements` is the data of a measurement (what crosses process and network boundaries).
"""

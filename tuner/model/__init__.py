"""Whole models: read a model on the user's machine (`load`), partition it into the PrimFuncs a
build looks up (`pipeline`), spend one trial budget across them (`scheduler`, `job`), and build
it with the tuning database applied (`pipeline.build`)."""

# `--dtype` of tune-model and build (`tuner.model.lowp` puts a model in one): here, without TVM,
# so that the CLI refuses another before it loads anything
DTYPES = ("float32", "bfloat16")

"""Test doubles and test rigs, out of the production packages (like MetaSchedule's `testing/`):

- `fakes`: measurers that measure nothing (`FakeMeasurer`, `FlakyBoard`, `FlakyMeasurer`);
- `fakefarm`: a farm worker thread on the real Redis stream that commits records the way the
  API does (`FakeWorker`), and jobs and inputs to feed it;
- `rpcfarm`: a local TVM RPC tracker and servers (`LocalRpcFarm`);
- `measurer_contract`: the scenarios every `tuner.measure.Measurer` must pass.
"""

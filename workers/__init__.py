"""The farm's processes: the measurement agent (`agent`, `tunefarm worker`: leases trials from the
API and measures them with a measurer of `tuner.measure`) and the tuner service
(`tuner_service`, `tunefarm tuner`: claims jobs in SQL and runs their search loops), each with its
Prometheus metrics (`agent_metrics`, `service_metrics`).
"""

"""Search spaces: the registry maps a workload to its spaces (`schedules.registry`)."""

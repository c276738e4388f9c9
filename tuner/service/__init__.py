"""The service processes of the farm: the tuner loop (`runner.run_tuner`) and the measurer it
hands candidates to (`measurer.RemoteMeasurer`). The worker process lives in `workers.agent`."""

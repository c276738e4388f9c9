"""tunefarm's REST service (FastAPI). Not built yet: see the service issue."""

"""tunefarm's REST service (FastAPI): `api.app.create_app()` builds the app, `api.app.serve()`
runs it under uvicorn, `api.client.Client` talks to it."""

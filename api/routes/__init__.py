"""One router per resource; `api.app.create_app` includes them (health at the root).

Each router carries the full `/v1/...` prefix itself, so a route's `path` is the public route
template (the metrics label)."""

V1 = "/v1"

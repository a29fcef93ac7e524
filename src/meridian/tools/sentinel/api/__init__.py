"""The HTTP control plane (FastAPI): the app with one router per resource, its
guard (token, body size, loopback), models (the config's own types) and server."""

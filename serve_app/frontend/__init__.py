"""The frontend: what runs where a client's HTTP request arrives (its own Serve deployment, or inside the
serving engine replica with `frontend.direct_streaming`). The ASGI app and its middleware (app.py), the
request path and its guards (ingress.py), deadlines on the engine's stream (deadlines.py), and the one
error shape (errors.py)."""

"""Local, laptop/CI-sized runs of the app: a tiny model, a loopback Ray cluster with role-labelled
nodes, and the same serve config (import_path serve_app.builder:build_app, AppConfig args) the chart renders.

Not part of the image: pods run only `serve_app`. The demo (`make demo`), the tests and the benchmarks use this."""

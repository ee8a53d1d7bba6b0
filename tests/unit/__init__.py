"""Unit tests of serve_app's decision modules, one file beside each (limits, guards, admission, roles,
containment, deadlines, errors, overflow, upstream, auth, config): plain asyncio with injected clocks and
data sources, no Ray cluster, no engine; the whole suite runs in seconds."""

"""Load-test building blocks for OpenAI-compatible LLM endpoints (used by loadtests/locustfile.py).

Modules: profiles (workload shapes), prompts (prompts of a target token count), sse (stream
timing), samples (exact percentiles), slo (thresholds and exit code), options (CLI), server
(setup calls). Only locustfile.py imports Locust; the rest is plain Python.
"""

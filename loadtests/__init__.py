"""Locust load tests for OpenAI-compatible endpoints. See loadtests/README.md."""

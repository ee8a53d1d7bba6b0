"""Helm chart tests (charts/ray-llm-disagg): a package so its module names never clash with other suites."""

"""In-cluster load test manifests (python -m loadtests.k8s.render)."""

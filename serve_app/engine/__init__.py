"""The engine replicas: Ray Serve LLM's servers extended (metrics, selective decode, prefill failover,
direct streaming) and the stream batching that decides when chunks leave the replica."""

"""What every process of the app records: the per-request hop clock, Prometheus metrics, loggers."""

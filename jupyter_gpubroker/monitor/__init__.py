"""Monitoring: device samples (SQLite, downsampled), the sampling pass that drives health
and reclaim, and Prometheus metrics. Host-side: it reads NVML and drives the core."""

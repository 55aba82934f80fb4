"""Prometheus metrics: what the service counts as it works, and what it reads from its
state when scraped (docs/metrics.md lists every metric)."""

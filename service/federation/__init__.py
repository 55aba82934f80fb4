"""Federation: regions register with a global service, push signed summaries, and each
job is routed to the best region by bandwidth and cost (docs/federation.md)."""

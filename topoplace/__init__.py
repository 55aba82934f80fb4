"""The `topoplace` command: one entry point for the engine, service and agent."""

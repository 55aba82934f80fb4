"""topoplace's central service: HTTP API, persistence and the in-memory cluster state.

Depends on ``placement`` (the pure engine); ``placement`` never imports this.
"""

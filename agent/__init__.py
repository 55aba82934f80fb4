"""The node agent: discovers a node's GPU topology and reports it to the service."""

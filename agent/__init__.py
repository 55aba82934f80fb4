"""The node agent: discovers a node's GPU topology and reports it to the service.

It depends on ``placement`` (the snapshot model, profiles, topology text) and
on the service's HTTP API through ``topoplace.client``; never on ``service``.
"""

SOURCE_KINDS = "nvml (default), smi:FILE, sim:PROFILE or fake:PROFILE"

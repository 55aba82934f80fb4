"""The node agent: discovers a node's GPU topology and reports it to the service.

It depends on ``placement`` (the snapshot model, profiles, topology text) and
on the service's HTTP API through ``topoplace_client``; never on ``service``
nor on the command line (``topoplace``), which finds ``topoplace agent``
through the ``topoplace.commands`` entry point instead of importing it.
"""

SOURCE_KINDS = "nvml (default), smi:FILE, sim:PROFILE or fake:PROFILE"

"""What the command line (``topoplace``) and the node agent (``agent``) share.

- ``topoplace_client.api``: the typed HTTP client of the service's API and
  its two failures (``ApiError``, ``ServiceUnreachable``);
- ``topoplace_client.arguments``: argparse value types both command lines use;
- ``topoplace_client.topology_file``: a node's topology read from a file.

It depends on ``placement`` and on the service only through its HTTP API, and
both ``agent`` and ``topoplace`` import it instead of each other (the test
``tests/test_package_boundaries.py`` holds them to it). This module imports
nothing, so a command that never talks to the service does not pay httpx's
import time.
"""

"""The service's edge: what every HTTP request passes before any route reads it.

- :mod:`service.edge.faults`: a fault answers 500 in the one error shape and
  the connection stays usable;
- :mod:`service.edge.guard`: the URL, header and body checks (limits,
  control characters, JSON nesting);
- :mod:`service.edge.json_scan`: the body checks made on raw bytes, before
  any parser sees them.
"""

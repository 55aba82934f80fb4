"""Slurm's text formats, as pure functions: host lists, TRES strings, the
configuration lines written from snapshots, and the admin comment the filter
puts on a job.

Both the service's Slurm adapter (``service.slurm``) and the command line
(``topoplace slurm``) read and write these, so they live apart from either:
this package imports only the standard library and ``placement``.
"""

"""`topoplace sim`: replay a job trace over a cluster, the engine against baselines."""

"""The Slurm adapter: translates what Slurm's job_submit.lua sends into the same
core calls every other caller makes (``service.allocations.api``), writes
Slurm configuration from stored snapshots, and releases what Slurm no longer
holds. No placement logic lives here."""

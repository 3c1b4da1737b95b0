"""The slurm-syncer service (see docs/slurm-syncer.md for the rules it implements)."""

SERVICE = "slurm-syncer"

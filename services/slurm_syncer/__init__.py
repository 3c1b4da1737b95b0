"""The slurm-syncer service (see ../shared/DESIGN.md for what it owns)."""

SERVICE = "slurm-syncer"

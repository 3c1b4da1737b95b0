"""The maintenance-scheduler service: NodeMaintenance (maintenance.nvidia.com/v1alpha1)
scheduled under cluster-wide budgets, cordoned and drained Slurm first."""

SERVICE = "maintenance-scheduler"

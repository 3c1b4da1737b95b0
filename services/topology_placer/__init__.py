"""The topology-placer service: gang and network-topology placement, and job-level
preemption, for the pods that name it as their scheduler."""

SERVICE = "topology-placer"

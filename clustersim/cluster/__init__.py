"""Simulated cluster actors: nodes, kubelet, default scheduler, job controller, Slurm wiring.

Pure decision logic lives in small modules (`quantity`, `spec`, `scheduling`, `podlife`,
`joblogic`); the actors (`kubelet`, `scheduler`, `jobcontroller`, `slurmwire`) are thin loops
that read the in-memory Kubernetes store, ask the pure functions what to do, and write back.
"""

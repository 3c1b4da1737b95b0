"""Skyhook: node packages run as batch/v1 Jobs, rolled out under a DeploymentPolicy.

A second controller of maintenance-scheduler, built like the NodeMaintenance one: a pure
decision core (`api` parses, `stages` walks one package on one node, `rollout` shapes the
batches, `plan` decides one round) and thin adapters (`commands`, `service`).
"""

"""Slurm as a source of inventory and a sink of health: the slurmrestd client, the import, the node drain."""

"""GPU/NPU scheduling. Rooms: `engine/` the pure placement engine (no Django imports), `inventory/`
its formats and import, health ingestion and agents, `mig/` everything MIG, `slurm/` the Slurm client and reconciler."""

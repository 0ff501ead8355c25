"""GPU/NPU scheduling. Rooms: `engine/` the pure placement engine (no Django imports), `inventory/`
its formats, health, readings and agents, `mig/` everything MIG, `slurm/` the Slurm client and reconciler."""

"""GPU/NPU scheduling. `scheduling.placement` is the pure placement engine (no Django imports)."""

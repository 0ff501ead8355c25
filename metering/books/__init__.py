"""Slurm's own books against the platform's meter, and the hours advance reservations held with nothing running."""

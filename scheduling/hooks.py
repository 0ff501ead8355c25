"""Hooks a higher app fills in its ready(), so scheduling never imports it."""

from collections.abc import Callable

# provisioning: start tearing a releasing request's environment down; it returns the capacity itself at the end
# (allocation_free). Returns False when nothing was provisioned, and the devices are freed at once.
release_teardown: Callable[..., bool] | None = None

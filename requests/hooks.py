"""Hooks higher apps fill in their ready(), so request pages and the API can show their data without importing
them (see docs/architecture.md, "Layering")."""

from collections.abc import Callable
from typing import Any

# scheduling: the request's allocation (node, devices, expiry) as a dict, or None.
allocation_details: Callable[[Any], dict | None] | None = None

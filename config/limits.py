"""Bounds on input numbers shared by the API fields and filters."""

# Ids are bigint columns: a larger number can name nothing, so it is refused before any query.
BIGINT_MAX = 2**63 - 1

"""Extension points that higher apps fill in `ready()`, so tenancy can show their data without importing them."""

# Current quota usage of projects: a callable taking a list of project ids and returning
# {project_id: {dimension: value}}. The request workflow registers it; None means nobody tracks usage.
project_usage_provider = None

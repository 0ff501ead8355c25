"""The inventory's own code: file formats, health ingestion, telemetry readings and node agents' tokens."""

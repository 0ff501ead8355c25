"""The inventory's own code: its file formats and their import, health ingestion and node agents' tokens.

A room above the app's models and services (it writes through them; neither imports it, so no import circle:
`make lint`'s acyclic contract). What the models themselves need stays beside them: `scheduling.readings`, the
numbers a health rule's thresholds may hold.
"""

"""The pure placement engine: no Django, no app imports, an in-memory snapshot in and bindings and reasons out."""

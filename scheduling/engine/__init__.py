"""The pure placement engine: no Django and no app imports; an in-memory snapshot in, bindings and reasons out.

Its data classes are named apart from the Django models they are read from, so that a reader (and a module
that imports both) never mistakes one for the other: `DeviceView` and `NodeView` are frozen copies of what the
inventory says of a card and a node, `RunningAllocation` is work that runs now as the snapshot holds it.
"""

# The order caps (config/settings.py): benchmarks order many times from few seeded people into few projects, which
# the caps would refuse, so their processes run without them.
ORDER_CAP_SETTINGS = (
    "ORDER_MAX_OPEN_PER_REQUESTER",
    "ORDER_MAX_OPEN_PER_PROJECT",
    "ORDER_MAX_WAITING_PER_REQUESTER",
    "ORDER_MAX_WAITING_PER_PROJECT",
)

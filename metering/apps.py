from django.apps import AppConfig


class MeteringConfig(AppConfig):
    name = "metering"
    verbose_name = "Metering, budgets and usage"
    operator_permissions = [
        *(
            f"metering.view_{model}"
            for model in ("telemetrysample", "dailyusage", "budgetalert", "idlewatch", "slurmbooks")
        ),
        *(f"metering.{action}_idlepolicy" for action in ("view", "add", "change", "delete")),
    ]

    def ready(self):
        from metering import wiring

        wiring.connect()

from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"
    verbose_name = "Model serving"
    operator_permissions = [
        "serving.view_servingdeployment",
        "serving.view_servingreplica",
        "serving.view_apikey",
    ]

    def ready(self):
        from serving import wiring

        wiring.connect()

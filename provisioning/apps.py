from django.apps import AppConfig


class ProvisioningConfig(AppConfig):
    name = "provisioning"
    verbose_name = "Provisioning"
    operator_permissions = ["provisioning.view_provisioningrun", "provisioning.view_provisioningstep",
                            "provisioning.retry_provisioningrun", "provisioning.view_servingdeployment",
                            "provisioning.view_servingreplica", "provisioning.view_apikey"]

    def ready(self):
        from provisioning import wiring

        wiring.connect()

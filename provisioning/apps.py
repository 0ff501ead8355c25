from django.apps import AppConfig


class ProvisioningConfig(AppConfig):
    name = "provisioning"
    verbose_name = "Provisioning"
    operator_permissions = [
        "provisioning.view_provisioningrun",
        "provisioning.view_provisioningstep",
        "provisioning.retry_provisioningrun",
        "provisioning.force_release_provisioningrun",
        "provisioning.view_connectsecret",
        "provisioning.reveal_connectsecret",
    ]

    def ready(self):
        from django.core import checks

        from config import workers
        from provisioning import wiring
        from provisioning.checks import check_driver_registries, check_slurm_job_directory

        checks.register(check_slurm_job_directory)
        checks.register(check_driver_registries)
        wiring.connect()
        workers.install()  # qcluster stops promptly and hands back its work (long steps and installs live here)

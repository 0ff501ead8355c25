from django.apps import AppConfig


def _crud(app_label: str, model: str, *verbs: str) -> list[str]:
    return [f"{app_label}.{verb}_{model}" for verb in verbs]


class TenancyConfig(AppConfig):
    name = "tenancy"
    verbose_name = "Tenancy, projects and quotas"
    operator_permissions = [
        "tenancy.view_user",
        *_crud("tenancy", "tenant", "view", "add", "change"),
        *_crud("tenancy", "project", "view", "add", "change"),
        *_crud("tenancy", "membership", "view", "add", "change", "delete"),
        *_crud("tenancy", "projectquota", "view", "change"),
        *_crud("tenancy", "tenantquota", "view", "add", "change"),
        "tenancy.view_auditevent",
        "tenancy.view_invitation",
        *_crud("tenancy", "apitoken", "view", "change"),  # change: revoke
        "tenancy.view_serviceaccount",
        "tenancy.view_directoryaccount",
        "tenancy.view_directorygrant",
        *_crud("tenancy", "groupmapping", "view", "add", "change", "delete"),
        # Sign-in lockouts (django-axes): see failures and sign-ins, clear a lockout (audited, tenancy.sign_in).
        *_crud("axes", "accessattempt", "view", "delete"),
        "axes.view_accesslog",
        "axes.view_accessfailurelog",
    ]

    def ready(self):
        from tenancy import wiring

        wiring.connect(self)

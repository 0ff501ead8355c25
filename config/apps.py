from django.contrib.admin.apps import AdminConfig


class OperatorAdminConfig(AdminConfig):
    """django.contrib.admin with the operator console's site (its home is a dashboard)."""

    default_site = "config.admin_site.OperatorAdminSite"

"""The operator console's site: Django's admin with a home page that is a dashboard (config.dashboard)."""

from django.contrib import admin

from config.dashboard import panels_for


class OperatorAdminSite(admin.AdminSite):
    site_header = "Compute Catalog operator console"
    site_title = "Operator console"
    index_title = "Operator home"
    index_template = "admin/dashboard.html"

    def index(self, request, extra_context=None):
        return super().index(request, extra_context={"panels": panels_for(request), **(extra_context or {})})

from django.urls import path

from requests import notification_views, views

app_name = "portal"

urlpatterns = [
    path("", views.catalog, name="catalog"),
    path("order/<slug:slug>/", views.order, name="order"),
    path("order/<slug:slug>/preview/", views.order_preview, name="order-preview"),
    path("requests/", views.request_list, name="request-list"),
    path("requests/<int:pk>/", views.request_detail, name="request-detail"),
    path("requests/<int:pk>/status/", views.request_status, name="request-status"),
    path("requests/<int:pk>/endpoint-health/", views.request_endpoint_health, name="request-endpoint-health"),
    path("requests/<int:pk>/cancel/", views.request_cancel, name="request-cancel"),
    path("requests/<int:pk>/release/", views.request_release, name="request-release"),
    path("requests/<int:pk>/extend/", views.request_extend, name="request-extend"),
    path("approvals/", views.approval_inbox, name="approval-inbox"),
    path("approvals/<int:pk>/decide/", views.approval_decide, name="approval-decide"),
    path("approvals/bulk-approve/", views.approval_bulk_approve, name="approval-bulk-approve"),
    path("approvals/bulk/", views.approval_bulk_decide, name="approval-bulk-decide"),
    path("projects/", views.project_list, name="project-list"),
    path("projects/<int:pk>/quota/", views.project_quota, name="project-quota"),
    path("notifications/", notification_views.notification_preferences, name="notifications"),
]

from django.urls import path

from metering.api import views

urlpatterns = [
    path("", views.UsageReportView.as_view(), name="usage-report"),
    path("export/", views.UsageExportView.as_view(), name="usage-export"),
    path("budgets/", views.BudgetListView.as_view(), name="usage-budgets"),
    path("recommendations/", views.RecommendationListView.as_view(), name="usage-recommendations"),
    path("zero-touch/", views.ZeroTouchView.as_view(), name="usage-zero-touch"),
    path("tokens/", views.TokenUsageView.as_view(), name="usage-tokens"),
    path("idle/", views.IdleUsageView.as_view(), name="usage-idle"),
    path("slurm-books/", views.SlurmBooksView.as_view(), name="usage-slurm-books"),
    path("reserved-idle/", views.ReservedIdleView.as_view(), name="usage-reserved-idle"),
]

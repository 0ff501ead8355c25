from django.urls import path

from metering import views

app_name = "metering"

urlpatterns = [path("", views.usage, name="usage")]

from django.urls import path

from tenancy import views

app_name = "team"

urlpatterns = [
    path("projects/<int:pk>/team/", views.team_page, name="team"),
    path("projects/<int:pk>/team/<int:user_id>/role/", views.team_role, name="role"),
    path("projects/<int:pk>/team/<int:user_id>/remove/", views.team_remove, name="remove"),
    path("projects/<int:pk>/team/invitations/<int:invitation_id>/revoke/", views.invitation_revoke, name="revoke"),
    path("invitations/<str:token>/", views.invitation_accept, name="invitation-accept"),
]

from django.urls import path

from tenancy import views

app_name = "team"

urlpatterns = [
    path("projects/<int:pk>/team/", views.team_page, name="team"),
    path("projects/<int:pk>/team/<int:user_id>/role/", views.team_role, name="role"),
    path("projects/<int:pk>/team/<int:user_id>/remove/", views.team_remove, name="remove"),
    path("projects/<int:pk>/team/invitations/<int:invitation_id>/revoke/", views.invitation_revoke, name="revoke"),
    path("projects/<int:pk>/team/service-accounts/", views.service_account_create, name="service-account-create"),
    path(
        "projects/<int:pk>/team/service-accounts/<int:account_id>/tokens/",
        views.service_token_issue,
        name="service-token-issue",
    ),
    path(
        "projects/<int:pk>/team/service-accounts/<int:account_id>/deactivate/",
        views.service_account_deactivate,
        name="service-account-deactivate",
    ),
    path(
        "projects/<int:pk>/team/tokens/<int:token_id>/revoke/", views.service_token_revoke, name="service-token-revoke"
    ),
    path("account/api-tokens/", views.api_tokens_page, name="api-tokens"),
    path("account/api-tokens/<int:token_id>/revoke/", views.api_token_revoke, name="api-token-revoke"),
    path("device/", views.device_page, name="device"),
    path("account/ssh-keys/", views.ssh_keys_page, name="ssh-keys"),
    path("account/ssh-keys/<int:key_id>/remove/", views.ssh_key_remove, name="ssh-key-remove"),
    path("invitations/<str:token>/", views.invitation_accept, name="invitation-accept"),
]

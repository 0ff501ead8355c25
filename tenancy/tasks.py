"""django-q2 entry points: take ids, call one service."""

from tenancy import api_tokens, device_flow, team
from tenancy.directory import notices, sync


def send_invitation(invitation_id: int) -> int:
    return team.invitation_send(invitation_id=invitation_id)


def purge_api_tokens() -> int:
    return api_tokens.api_tokens_purge()


def purge_device_authorizations() -> int:
    return device_flow.device_authorizations_purge()


def tell_lead_of_directory_removal(project_id: int, user_id: int) -> int:
    return notices.lead_told_of_removal(project_id=project_id, user_id=user_id)


def sync_directory() -> dict:
    return sync.directory_sync().as_data()

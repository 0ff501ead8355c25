"""django-q2 entry points: take ids, call one service."""

from tenancy import api_tokens, team


def send_invitation(invitation_id: int) -> int:
    return team.invitation_send(invitation_id=invitation_id)


def purge_api_tokens() -> int:
    return api_tokens.api_tokens_purge()

"""django-q2 entry points: take ids, call one service."""

from tenancy import team


def send_invitation(invitation_id: int) -> int:
    return team.invitation_send(invitation_id=invitation_id)

from django.conf import settings

from requests.selectors import approval_inbox


def inbox_count(request) -> dict:
    """How many approval tasks wait for the signed-in user (shown in the navigation)."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    return {"inbox_count": approval_inbox(user=request.user).count()}


def currency(request) -> dict:
    """The catalog's currency, shown next to every price."""
    return {"currency": settings.CATALOG_CURRENCY}

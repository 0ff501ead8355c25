"""django-auth-ldap's search and group-type objects from plain settings (config/settings.py, LDAP_*)."""

from django.core.exceptions import ImproperlyConfigured


def search(base: str, filter_text: str):
    import ldap
    from django_auth_ldap.config import LDAPSearch

    if not base:
        raise ImproperlyConfigured("LDAP_USER_SEARCH_BASE and LDAP_GROUP_SEARCH_BASE must be set with LDAP_SERVER_URI")
    return LDAPSearch(base, ldap.SCOPE_SUBTREE, filter_text)


def group_type(name: str):
    """How groups hold members: groupOfNames (OpenLDAP), AD's group (member), posixGroup; `nested_` ones follow
    groups inside groups (AD's nested groups, OpenLDAP groups of groups)."""
    from django_auth_ldap import config

    types = {
        "group_of_names": config.GroupOfNamesType,
        "nested_group_of_names": config.NestedGroupOfNamesType,
        "active_directory": config.ActiveDirectoryGroupType,
        "nested_active_directory": config.NestedActiveDirectoryGroupType,
        "posix": config.PosixGroupType,
    }
    if name not in types:
        raise ImproperlyConfigured(f"LDAP_GROUP_TYPE must be one of {', '.join(types)}, got {name!r}")
    return types[name]()


def connection_options(timeout_seconds: int) -> dict:
    """A directory that does not answer is given up on after this long (the sync then changes nothing)."""
    import ldap

    return {ldap.OPT_NETWORK_TIMEOUT: timeout_seconds, ldap.OPT_TIMEOUT: timeout_seconds}

"""Company sign-in and the directory: OIDC (oidc.py) and LDAP/AD (ldap.py) sign-in, group mappings that grant
tenants, project roles and the operator role (rights.py), applied at every sign-in and by the periodic sync
(sync.py). docs/sign-in.md explains it for operators."""

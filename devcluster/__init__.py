"""Local daemons for development, the tests and the benchmarks: a Slurm cluster (`make run-slurm`), an OIDC provider
and an LDAP directory (`make run-sso`), podman as a container node, bare-metal test hosts. Not the test tree and not
the product: the product never imports it (pyproject.toml's import-linter contracts)."""

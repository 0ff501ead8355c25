"""Settings, read from the environment.

Embedded default (demo): SQLite and django-q2's ORM broker. Production and tests:
DATABASE_URL names PostgreSQL; REDIS_URL switches django-q2 to the Redis broker.
"""

from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_float, env_int, env_json, env_list, env_secret, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", default=False)
# The demo (`make run`): a development secret key, cookies over plain HTTP and static files served from the apps'
# folders, but without DEBUG, so that a bad URL or a failure shows the product's own error pages rather than Django's
# debug pages (which list the URLconf and settings). DEBUG implies it.
DEMO = env_bool("DEMO", default=DEBUG)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEMO:
        raise ImproperlyConfigured("SECRET_KEY must be set outside the demo (DEMO or DEBUG)")
    SECRET_KEY = "insecure-development-key-only-for-debug-mode"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "config.apps.OperatorAdminConfig",  # django.contrib.admin, its home a dashboard
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.humanize",  # "a minute ago", "1,024": numbers and times as people write them
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "guardian",
    "axes",
    "csp",
    "django_q",
    "tenancy",
    "catalog",
    "requests",
    "scheduling",
    "serving",
    "provisioning",
    "metering",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "config.middleware.RequestLimitsMiddleware",  # before anything reads the request
    "config.middleware.DatabaseConnectionLossMiddleware",  # a read on a lost connection runs once more on a new one
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "config.session_end.SessionEndedMiddleware",  # after authentication: it asks whether the user is signed in
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "axes.middleware.AxesMiddleware",  # last: it turns a sign-in lockout into the lockout page (config.signin)
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "config" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "requests.context_processors.inbox_count",
                "requests.context_processors.currency",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "tenancy.User"
# --- Sign-in (docs/sign-in.md) ------------------------------------------------------------------------------------
# Local passwords: on for everyone (the default and the demo), or off for all but the break-glass accounts named.
LOCAL_PASSWORD_SIGN_IN = env_bool("LOCAL_PASSWORD_SIGN_IN", default=True)
LOCAL_PASSWORD_ACCOUNTS = env_list("LOCAL_PASSWORD_ACCOUNTS")
# OpenID Connect (authorization code flow with PKCE; tenancy/directory/oidc.py), on when a client id is set. The
# IdP's endpoints come from its discovery document unless named one by one; the client secret and an IdP signing key
# (for IdPs whose ID tokens name no key) are read from files (secrets by reference) or, failing that, the variable.
OIDC_RP_CLIENT_ID = env_str("OIDC_CLIENT_ID")
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "your company")
OIDC_OP_DISCOVERY_URL = env_str("OIDC_DISCOVERY_URL")
OIDC_OP_ISSUER = env_str("OIDC_ISSUER")
OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("OIDC_AUTHORIZATION_ENDPOINT")
OIDC_OP_TOKEN_ENDPOINT = env_str("OIDC_TOKEN_ENDPOINT")
OIDC_OP_USER_ENDPOINT = env_str("OIDC_USERINFO_ENDPOINT")
OIDC_OP_JWKS_ENDPOINT = env_str("OIDC_JWKS_ENDPOINT")
OIDC_OP_LOGOUT_ENDPOINT = env_str("OIDC_END_SESSION_ENDPOINT")
OIDC_RP_CLIENT_SECRET = env_secret("OIDC_CLIENT_SECRET")
OIDC_RP_IDP_SIGN_KEY = env_secret("OIDC_IDP_SIGN_KEY") or None
OIDC_RP_SIGN_ALGO = env_str("OIDC_SIGN_ALGORITHM", "RS256")
OIDC_RP_SCOPES = env_str("OIDC_SCOPES", "openid email profile")
OIDC_TOKEN_AUTH_METHOD = env_str("OIDC_TOKEN_AUTH_METHOD", "client_secret_basic")  # or client_secret_post
OIDC_CLAIM_USERNAME = env_str("OIDC_CLAIM_USERNAME", "preferred_username")
OIDC_CLAIM_EMAIL = env_str("OIDC_CLAIM_EMAIL", "email")
OIDC_CLAIM_FIRST_NAME = env_str("OIDC_CLAIM_FIRST_NAME", "given_name")
OIDC_CLAIM_LAST_NAME = env_str("OIDC_CLAIM_LAST_NAME", "family_name")
OIDC_CLAIM_GROUPS = env_str("OIDC_CLAIM_GROUPS", "groups")
OIDC_TIMEOUT_SECONDS = env_float("OIDC_TIMEOUT_SECONDS", 10.0)
OIDC_VERIFY_TLS = env_bool("OIDC_VERIFY_TLS", default=True)
OIDC_CLOCK_LEEWAY_SECONDS = env_int("OIDC_CLOCK_LEEWAY_SECONDS", 60)
OIDC_DISCOVERY_CACHE_SECONDS = env_int("OIDC_DISCOVERY_CACHE_SECONDS", 3600)
# mozilla-django-oidc's views (tenancy/directory/views.py): PKCE with S256, a nonce, RP-initiated logout.
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_USE_NONCE = True
OIDC_OP_LOGOUT_URL_METHOD = "tenancy.directory.oidc.logout_url"
LOGIN_REDIRECT_URL_FAILURE = "login"
# LDAP / Active Directory (django-auth-ldap; tenancy/directory/ldap.py), on when a server is set: a service bind
# finds people and groups, each person binds with their own password.
LDAP_ENABLED = bool(env_str("LDAP_SERVER_URI"))
AUTH_LDAP_SERVER_URI = env_str("LDAP_SERVER_URI")
AUTH_LDAP_START_TLS = env_bool("LDAP_START_TLS", default=False)
AUTH_LDAP_BIND_DN = env_str("LDAP_BIND_DN")
AUTH_LDAP_BIND_PASSWORD = env_secret("LDAP_BIND_PASSWORD")
LDAP_TIMEOUT_SECONDS = env_int("LDAP_TIMEOUT_SECONDS", 10)
AUTH_LDAP_USER_ATTR_MAP = env_json(
    "LDAP_USER_ATTR_MAP", {"first_name": "givenName", "last_name": "sn", "email": "mail"}
)
AUTH_LDAP_FIND_GROUP_PERMS = False  # rights come from the group mappings, never from LDAP permissions
if LDAP_ENABLED:
    from config.ldap_settings import connection_options, group_type, search

    AUTH_LDAP_CONNECTION_OPTIONS = connection_options(LDAP_TIMEOUT_SECONDS)
    AUTH_LDAP_USER_SEARCH = search(env_str("LDAP_USER_SEARCH_BASE"), env_str("LDAP_USER_FILTER", "(uid=%(user)s)"))
    AUTH_LDAP_GROUP_SEARCH = search(
        env_str("LDAP_GROUP_SEARCH_BASE"), env_str("LDAP_GROUP_FILTER", "(objectClass=groupOfNames)")
    )
    AUTH_LDAP_GROUP_TYPE = group_type(env_str("LDAP_GROUP_TYPE", "nested_group_of_names"))
# The sync of everyone's groups (tenancy/directory/sync.py) runs this often: the longest a leaver keeps rights.
DIRECTORY_SYNC_MINUTES = env_int("DIRECTORY_SYNC_MINUTES", 15)

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: a locked-out account or address is refused before any check
    "tenancy.sign_in_backends.LocalPasswordBackend",
    *(["tenancy.directory.ldap.DirectoryLDAPBackend"] if LDAP_ENABLED else []),
    *(["tenancy.directory.oidc.OIDCBackend"] if OIDC_ENABLED else []),
    "guardian.backends.ObjectPermissionBackend",
]
# Anonymous visitors never hold object permissions, so guardian needs no anonymous user row.
ANONYMOUS_USER_NAME = None
GUARDIAN_MONKEY_PATCH_USER = False

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "config" / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEMO
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
# The demo serves static files from the apps' folders (no collectstatic), as runserver does with DEBUG.
WHITENOISE_USE_FINDERS = WHITENOISE_AUTOREFRESH = DEMO
# A form sent without its CSRF cookie (cookies cleared or blocked, the page older than a sign-out) gets a page of
# the product's own saying what to do.
CSRF_FAILURE_VIEW = "config.views.csrf_failure"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "portal:catalog"
LOGOUT_REDIRECT_URL = "login"

CATALOG_CURRENCY = env_str("CATALOG_CURRENCY", "USD")
# Pending approvals older than this get a reminder on their timeline (hourly django-q2 schedule).
APPROVAL_REMINDER_HOURS = env_int("APPROVAL_REMINDER_HOURS", 24)
# /metrics: scrapers send `Authorization: Bearer <token>`. Required outside the demo: the process refuses to start
# without it (the metrics name projects, nodes and queue reasons); in the demo an empty token leaves /metrics open.
METRICS_TOKEN = env_str("METRICS_TOKEN")
if not METRICS_TOKEN and not DEMO:
    raise ImproperlyConfigured("METRICS_TOKEN must be set when DEBUG is off (outside the demo; docs/security.md)")
# Scheduling: optional fair share, requeue on isolation, expiry warnings, when an allocation counts as stale.
SCHEDULER_FAIR_SHARE = env_bool("SCHEDULER_FAIR_SHARE", default=False)
SCHEDULER_REQUEUE_ON_ISOLATION = env_bool("SCHEDULER_REQUEUE_ON_ISOLATION", default=True)
# Bounded work per cycle: a cycle places and explains the first this many queued requests in queue order (priority
# class, fair share, submission); the ones behind them wait for a later cycle (0 = the whole queue). See
# docs/benchmarks/history.md (scheduler at scale) for the fairness rule.
SCHEDULER_CYCLE_WINDOW = env_int("SCHEDULER_CYCLE_WINDOW", 10000)
# Aging: a queued request is ordered one priority class higher for every this many minutes it has waited, up to
# `high` (0 = strict classes). The rule that bounds the longest wait: scheduling.cycle.aged_rank.
SCHEDULER_AGING_MINUTES = env_int("SCHEDULER_AGING_MINUTES", 60)
# Every this many cycles a scheduler process reads the whole cluster again and compares it with the state it kept
# from the change log (scheduling/cluster_state.py).
SCHEDULER_STATE_REBUILD_CYCLES = env_int("SCHEDULER_STATE_REBUILD_CYCLES", 100)
# A scheduler process keeps its placement engine and policy between cycles while the queue's typical shapes stay
# within this drift of the ones the policy was learnt from (0 = learn again every cycle; scheduling/kept_engine.py).
SCHEDULER_POLICY_DRIFT = env_float("SCHEDULER_POLICY_DRIFT", 0.1)
# Expected starts (scheduling/forecasting.py): each cycle replays the first this many waiting requests in queue order
# forward in time (the rest read "beyond the forecast"; 0 = no forecast), judging how early work ends by the last
# SCHEDULER_FORECAST_HISTORY ended terms.
SCHEDULER_FORECAST_QUEUE = env_int("SCHEDULER_FORECAST_QUEUE", 200)
SCHEDULER_FORECAST_HISTORY = env_int("SCHEDULER_FORECAST_HISTORY", 500)
# Advance reservations (requests/reservations.py): how far ahead a window may end, in days ...
RESERVATION_HORIZON_DAYS = env_int("RESERVATION_HORIZON_DAYS", 30)
# ... and how long after its start a reservation with nothing running is released as a no-show (its hours metered).
RESERVATION_NO_SHOW_MINUTES = env_int("RESERVATION_NO_SHOW_MINUTES", 30)
EXPIRY_WARNING_HOURS = env_int("EXPIRY_WARNING_HOURS", 4)
ALLOCATION_HEARTBEAT_TIMEOUT_MINUTES = env_int("ALLOCATION_HEARTBEAT_TIMEOUT_MINUTES", 30)
# Metering: telemetry driver (simulated or dcgm) and where each node's dcgm-exporter answers ({node} = node name),
# sampling and raw-sample retention, whether exhausting the monthly budget releases running work, rightsizing.
METERING_TELEMETRY_DRIVER = env_str("METERING_TELEMETRY_DRIVER", "simulated")
# Per vendor (its slug) or per node ("node:<name>"), the telemetry driver that reads its cards, as JSON, e.g.
# {"nvidia": "dcgm", "huawei": "simulated"}: a mixed fleet metered each vendor its own way. Empty: the driver above.
METERING_TELEMETRY_SOURCES = env_json("METERING_TELEMETRY_SOURCES", {})
METERING_DCGM_URL_TEMPLATE = env_str("METERING_DCGM_URL_TEMPLATE", "http://{node}:9400/metrics")
METERING_DCGM_TIMEOUT_SECONDS = env_int("METERING_DCGM_TIMEOUT_SECONDS", 5)
METERING_SAMPLE_INTERVAL_SECONDS = env_int("METERING_SAMPLE_INTERVAL_SECONDS", 60)
METERING_SAMPLE_RETENTION_DAYS = env_int("METERING_SAMPLE_RETENTION_DAYS", 14)
METERING_BUDGET_RELEASES_RUNNING = env_bool("METERING_BUDGET_RELEASES_RUNNING", default=False)
# The share of its monthly card-hour budget at which a project's lead is warned by mail (and its budget shows it).
METERING_BUDGET_WARNING_PERCENT = env_int("METERING_BUDGET_WARNING_PERCENT", 80)
METERING_RIGHTSIZING_WINDOW_DAYS = env_int("METERING_RIGHTSIZING_WINDOW_DAYS", 30)
METERING_RIGHTSIZING_MIN_REQUESTS = env_int("METERING_RIGHTSIZING_MIN_REQUESTS", 3)
METERING_RIGHTSIZING_MAX_MEAN_UTILIZATION = env_int("METERING_RIGHTSIZING_MAX_MEAN_UTILIZATION", 40)
METERING_RIGHTSIZING_HEADROOM_PERCENT = env_int("METERING_RIGHTSIZING_HEADROOM_PERCENT", 20)
# Provisioning (docs/provisioning.md). The BMC driver for bare metal: "simulated" (embedded default) or "redfish".
PROVISIONING_BMC_DRIVER = env_str("PROVISIONING_BMC_DRIVER", "simulated")
# Attempts per step and the exponential backoff between them (base * 2^(attempt-1), capped).
PROVISIONING_MAX_ATTEMPTS = env_int("PROVISIONING_MAX_ATTEMPTS", 4)
PROVISIONING_BACKOFF_SECONDS = env_float("PROVISIONING_BACKOFF_SECONDS", 2.0)
PROVISIONING_BACKOFF_MAX_SECONDS = env_float("PROVISIONING_BACKOFF_MAX_SECONDS", 120.0)
# A backend that does not answer (docs/provisioning.md, "Outages") is waited out, never a failure: a provisioning step
# for up to this much outage, a teardown until the backend answers. Meanwhile the step asks again after as long as
# the outage has lasted (from PROVISIONING_BACKOFF_SECONDS up to the retry maximum), and while a whole backend (a
# Slurm controller) is out one task asks it every PROVISIONING_OUTAGE_PROBE_SECONDS, so its return is seen at once
# (for up to PROVISIONING_OUTAGE_WATCH_SECONDS a task, below Q_TIMEOUT; the minute reconciler starts the next).
PROVISIONING_OUTAGE_BUDGET_SECONDS = env_float("PROVISIONING_OUTAGE_BUDGET_SECONDS", 900.0)
PROVISIONING_OUTAGE_RETRY_MAX_SECONDS = env_float("PROVISIONING_OUTAGE_RETRY_MAX_SECONDS", 10.0)
PROVISIONING_OUTAGE_PROBE_SECONDS = env_float("PROVISIONING_OUTAGE_PROBE_SECONDS", 2.0)
PROVISIONING_OUTAGE_WATCH_SECONDS = env_float("PROVISIONING_OUTAGE_WATCH_SECONDS", 240.0)
# A worker sleeps through waits up to this long; longer ones go back to the minute sweeper (or an event).
PROVISIONING_INLINE_WAIT_SECONDS = env_float("PROVISIONING_INLINE_WAIT_SECONDS", 30.0)
# A worker that finishes a step goes on with the run's next one, starting none after this many seconds of the task
# (well under Q_TIMEOUT): the rest goes back to the broker as one task.
PROVISIONING_CHAIN_SECONDS = env_float("PROVISIONING_CHAIN_SECONDS", 60.0)
# Runs a scheduling cycle's placements start per task (the rest go to other workers, a batch per task).
PROVISIONING_START_BATCH = env_int("PROVISIONING_START_BATCH", 10)
# Per-step timeout overrides in seconds, e.g. {"wait_for_install": 5400}.
PROVISIONING_STEP_TIMEOUTS = env_json("PROVISIONING_STEP_TIMEOUTS", {})
# An allocated request with no provisioning run after this long is started (or released) by the sweeper.
PROVISIONING_START_GRACE_SECONDS = env_int("PROVISIONING_START_GRACE_SECONDS", 120)
# A request releasing this long with its allocation held and no teardown run lost its teardown task: the minute
# sweeper starts it (teardowns are idempotent, so a late original changes nothing).
PROVISIONING_RELEASE_GRACE_SECONDS = env_int("PROVISIONING_RELEASE_GRACE_SECONDS", 30)
# Slurm jobs (the `slurm` execution backend): the partition they go to (empty: the cluster's default) and the
# directory on the nodes that is their working directory and holds their output (cc-request-<id>-<job id>.out):
# the Slurm user's own (mode 0700), never a shared temporary directory (system check provisioning.E002).
SLURM_PARTITION = env_str("SLURM_PARTITION")
SLURM_JOB_DIRECTORY = env_str("SLURM_JOB_DIRECTORY", "/var/lib/compute-catalog/slurm-jobs")
# Keys that encrypt stored secrets the platform shows again (a workspace's Jupyter token; config/encryption.py):
# comma-separated Fernet keys, the first encrypts. Empty: keys derived from SECRET_KEY and SECRET_KEY_FALLBACKS.
SECRETS_ENCRYPTION_KEYS = env_list("SECRETS_ENCRYPTION_KEYS")
# Where OS installers post their completion callback.
PUBLIC_BASE_URL = env_str("PUBLIC_BASE_URL", "http://127.0.0.1:8000")
# Mail (README, "Notifications"): SMTP when EMAIL_HOST is set, else the console (the demo prints mails).
EMAIL_HOST = env_str("EMAIL_HOST")
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", default=False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Compute Catalog <compute-catalog@localhost>")
# Approvers get one digest of what waits for them, at most this often (a django-q2 schedule).
NOTIFY_APPROVAL_DIGEST_MINUTES = env_int("NOTIFY_APPROVAL_DIGEST_MINUTES", 15)
# A team invitation's sign-up link works this long, once.
TEAM_INVITATION_DAYS = env_int("TEAM_INVITATION_DAYS", 7)
# Caps on a project's orders (0: no cap), each overridable per project on its quota in the operator console: open
# orders (not yet ended) and orders waiting for quota, per requester and for the whole project. A waiting order is
# cancelled after ORDER_WAITING_EXPIRY_HOURS, with the reason on its timeline and a mail to its requester.
ORDER_MAX_OPEN_PER_REQUESTER = env_int("ORDER_MAX_OPEN_PER_REQUESTER", 100)
ORDER_MAX_OPEN_PER_PROJECT = env_int("ORDER_MAX_OPEN_PER_PROJECT", 1000)
ORDER_MAX_WAITING_PER_REQUESTER = env_int("ORDER_MAX_WAITING_PER_REQUESTER", 20)
ORDER_MAX_WAITING_PER_PROJECT = env_int("ORDER_MAX_WAITING_PER_PROJECT", 100)
ORDER_WAITING_EXPIRY_HOURS = env_int("ORDER_WAITING_EXPIRY_HOURS", 7 * 24)
# The simulated drivers: a multiplier on their realistic durations (0 = instant), and injected faults:
# [{"step": "install_gpu_driver", "attempts": [1, 2] or "all", "code": "...", "message": "...", "retryable": true}].
PROVISIONING_SIMULATED_SPEED = env_float("PROVISIONING_SIMULATED_SPEED", 0.1)
PROVISIONING_FAULTS = env_json("PROVISIONING_FAULTS", [])
# Redfish: per-request timeout, TLS verification, and BMC credentials by reference (Node.bmc_credentials_ref):
# {"<ref>": {"username": "...", "password": "..."}}, from a JSON file that is not in the repository.
REDFISH_TIMEOUT_SECONDS = env_float("REDFISH_TIMEOUT_SECONDS", 10.0)
REDFISH_VERIFY_TLS = env_bool("REDFISH_VERIFY_TLS", default=True)
BMC_CREDENTIALS = env_json("BMC_CREDENTIALS", {})
# The in-band driver of a bare-metal server's post-install steps (docs/provisioning.md, "Ansible"): "simulated"
# (embedded default) or "ansible" (ansible-playbook from ANSIBLE_PLAYBOOK, `make ansible-venv`, over SSH to the
# node's os_address with the key its ssh_credentials_ref names: {"<ref>": {"username": "root",
# "private_key_file": "/path"}}, from a JSON file that is not in the repository). Host keys are recorded per node
# under ANSIBLE_STATE_DIR on first contact and checked afterwards. GPU driver packages are looked up in
# INBAND_PACKAGE_DIR as cc-gpu-driver_<version>_*.deb. The shared Slurm cluster (profiles whose slurm_membership is
# shared_cluster_no_root: their tenant gets no root) is joined with SLURM_CONF's configuration (its ClusterName must
# be the profile's target_cluster), the munge key in INBAND_MUNGE_KEY_FILE and slurmctld at INBAND_SLURMCTLD_ADDRESS,
# the address the servers reach the controller at; a server whose tenant has root never gets that key.
PROVISIONING_IN_BAND_DRIVER = env_str("PROVISIONING_IN_BAND_DRIVER", "simulated")
ANSIBLE_PLAYBOOK = env_str("ANSIBLE_PLAYBOOK", str(BASE_DIR / ".venv-ansible" / "bin" / "ansible-playbook"))
ANSIBLE_STATE_DIR = env_str("ANSIBLE_STATE_DIR", str(Path.home() / ".local" / "state" / "compute-catalog" / "ansible"))
ANSIBLE_CONNECT_TIMEOUT_SECONDS = env_int("ANSIBLE_CONNECT_TIMEOUT_SECONDS", 10)
SSH_CREDENTIALS = env_json("SSH_CREDENTIALS", {})
INBAND_PACKAGE_DIR = env_str("INBAND_PACKAGE_DIR", "/srv/compute-catalog/packages")
INBAND_MUNGE_KEY_FILE = env_str("INBAND_MUNGE_KEY_FILE", "/etc/munge/munge.key")
INBAND_SLURMCTLD_ADDRESS = env_str("INBAND_SLURMCTLD_ADDRESS")
INBAND_METRICS_PORT = env_int("INBAND_METRICS_PORT", 9100)
INBAND_GPU_METRICS_PORT = env_int("INBAND_GPU_METRICS_PORT", 9400)  # the profile's GPU exporter (dcgm-exporter's port)
# The container execution backend (nodes with execution_backend "container"): podman on the node, reached through
# its remote interface. Templates take {node} (the node's name): the podman URL (ssh://... or unix://...), the host
# users connect to, and each allocated device's node on the host (also {index}, {uuid}). Ports are published on
# CONTAINER_PUBLISH_IP. CONTAINER_CDI_KINDS maps a node with a CDI spec to its device kind (e.g. "nvidia.com/gpu"):
# there devices are bound by CDI name (<kind>=<uuid>) instead of device node.
CONTAINER_PODMAN_URL = env_str("CONTAINER_PODMAN_URL", "ssh://root@{node}/run/podman/podman.sock")
CONTAINER_ACCESS_HOST = env_str("CONTAINER_ACCESS_HOST", "{node}")
CONTAINER_PUBLISH_IP = env_str("CONTAINER_PUBLISH_IP", "0.0.0.0")
CONTAINER_DEVICE_PATH = env_str("CONTAINER_DEVICE_PATH", "/dev/nvidia{index}")
CONTAINER_CDI_KINDS = env_json("CONTAINER_CDI_KINDS", {})
# A multi-node gang's containers (one per member, on each member's node) join this podman network, which must exist
# on every container node and route between them (a macvlan or ipvlan network on the training fabric; podman's
# default bridge network, "podman", joins containers of one host only). Members reach member 0 there on
# CONTAINER_RENDEZVOUS_PORT (torchrun's default), the MASTER_ADDR:MASTER_PORT each is given.
CONTAINER_GANG_NETWORK = env_str("CONTAINER_GANG_NETWORK", "podman")
CONTAINER_RENDEZVOUS_PORT = env_int("CONTAINER_RENDEZVOUS_PORT", 29500)
# Names and labels this platform's containers: two platforms (or a test run) sharing a node keep apart.
CONTAINER_INSTANCE = env_str("CONTAINER_INSTANCE", "compute-catalog")
# Images whose reference is "containerfile:<name>" are built from <CONTAINER_IMAGE_DIR>/<name>/Containerfile, once
# per content hash; what the build needs besides podman (a debootstrap'd root filesystem) is kept in the cache.
CONTAINER_IMAGE_DIR = env_str("CONTAINER_IMAGE_DIR", str(BASE_DIR / "provisioning" / "images"))
CONTAINER_IMAGE_CACHE = env_str("CONTAINER_IMAGE_CACHE", str(Path.home() / ".cache" / "compute-catalog" / "images"))
CONTAINER_COMMAND_TIMEOUT_SECONDS = env_float("CONTAINER_COMMAND_TIMEOUT_SECONDS", 60.0)
# How many of a batch's containers one worker starts (and probes) at once, each podman call in its own thread.
CONTAINER_BATCH_CONCURRENCY = env_int("CONTAINER_BATCH_CONCURRENCY", 8)
CONTAINER_BUILD_TIMEOUT_SECONDS = env_float("CONTAINER_BUILD_TIMEOUT_SECONDS", 1800.0)
# Slurm (docs/inventory.md, "From Slurm"): slurmrestd's URL (without /slurm/v0.0.38), the user the JWT belongs to,
# the JWT itself or, better, a file holding it (a mounted secret; read on every use, so rotation needs no restart),
# and the per-call timeout. scontrol (node drain/resume: v0.0.38 has no node update) reads SLURM_CONF when set.
SLURM_REST_URL = env_str("SLURM_REST_URL")
SLURM_USER_NAME = env_str("SLURM_USER_NAME")
SLURM_JWT = env_str("SLURM_JWT")
SLURM_JWT_FILE = env_str("SLURM_JWT_FILE")
SLURM_TIMEOUT_SECONDS = env_float("SLURM_TIMEOUT_SECONDS", 10.0)
# How many of a batch's nodes or jobs one look asks slurmrestd for at once (each a GET of one node or job).
SLURM_WATCH_CONCURRENCY = env_int("SLURM_WATCH_CONCURRENCY", 8)
SLURM_CONF = env_str("SLURM_CONF")
SLURM_SCONTROL = env_str("SLURM_SCONTROL", "scontrol")
# Slurm's own books (slurmdbd), read with sacct (SLURM_CONF as for scontrol): metering reconciles the card-hours of
# Slurm-run work against them every SLURM_BOOKS_MINUTES while SLURM_REST_URL is set.
SLURM_SACCT = env_str("SLURM_SACCT", "sacct")
SLURM_BOOKS_MINUTES = env_int("SLURM_BOOKS_MINUTES", 15)
# Slurm GRES type -> catalog accelerator model (slug or name) for `import_inventory --from-slurm`, e.g.
# {"a100": "a100-40gb", "gpu": "t4-16gb"} ("gpu" names untyped GPUs); --gpu-model adds to it.
SLURM_GPU_MODELS = env_json("SLURM_GPU_MODELS", {})
# The site the Slurm cluster's nodes go into (and the scope of "vanished" nodes); the periodic import uses it and
# `import_inventory --from-slurm` defaults --site to it.
SLURM_SITE = env_str("SLURM_SITE")
# Model serving: per-key rate limit when the order does not set one, and how long the gateway waits for a replica.
SERVING_DEFAULT_RATE_LIMIT_PER_MINUTE = env_int("SERVING_DEFAULT_RATE_LIMIT_PER_MINUTE", 600)
GATEWAY_UPSTREAM_TIMEOUT_SECONDS = env_float("GATEWAY_UPSTREAM_TIMEOUT_SECONDS", 60.0)
# The gateway data plane (`manage.py run_gateway`, docs/serving.md): where this web server relays /serve/... to (the
# demo's `make run` starts one beside it), how often a gateway polls Redis for a control-plane change, how long its
# snapshot lives without Redis, how often it flushes its token tallies, and how long a stop waits for calls in flight.
GATEWAY_URL = env_str("GATEWAY_URL")
# The `llamacpp` serving runtime (provisioning/drivers/llamacpp.py): the Python of the venv `make llama` builds, and
# where its servers' logs go (empty: discarded).
LLAMACPP_PYTHON = env_str("LLAMACPP_PYTHON", str(BASE_DIR / ".venv-llama" / "bin" / "python"))
LLAMACPP_LOG_DIR = env_str("LLAMACPP_LOG_DIR")
GATEWAY_POLL_SECONDS = env_float("GATEWAY_POLL_SECONDS", 0.1)
GATEWAY_SNAPSHOT_TTL_SECONDS = env_float("GATEWAY_SNAPSHOT_TTL_SECONDS", 0.5)
GATEWAY_FLUSH_SECONDS = env_float("GATEWAY_FLUSH_SECONDS", 1.0)
GATEWAY_SHUTDOWN_SECONDS = env_float("GATEWAY_SHUTDOWN_SECONDS", 10.0)
# How long the gateway holds a call to an endpoint scaled to zero while a replica starts (else 503 with Retry-After).
GATEWAY_WAKE_SECONDS = env_float("GATEWAY_WAKE_SECONDS", 120.0)

# Input limits (docs/architecture.md, "Input limits"). Bodies over REQUEST_MAX_BODY_BYTES get a JSON 413 (read and
# discarded up to REQUEST_DRAIN_MAX_BYTES, so the keep-alive connection survives) and query strings over
# REQUEST_MAX_QUERY_STRING_LENGTH a JSON 414 (gunicorn.conf.py lets request lines of up to 8190 bytes reach the app);
# JSON nests at most API_JSON_MAX_DEPTH levels. (An order's parameters are bounded by its service's parameter schema.)
REQUEST_MAX_BODY_BYTES = env_int("REQUEST_MAX_BODY_BYTES", 8 * 1024 * 1024)
REQUEST_DRAIN_MAX_BYTES = env_int("REQUEST_DRAIN_MAX_BYTES", 64 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = REQUEST_MAX_BODY_BYTES
REQUEST_MAX_QUERY_STRING_LENGTH = env_int("REQUEST_MAX_QUERY_STRING_LENGTH", 2048)
API_JSON_MAX_DEPTH = env_int("API_JSON_MAX_DEPTH", 20)

REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header turns "not authenticated" into 401 rather than 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "config.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "config.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "config.api.StandardPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.SearchFilter",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Each signed-in user at API_THROTTLE_USER_RATE; anonymous endpoints carry their own throttles (config.throttling).
    "DEFAULT_THROTTLE_CLASSES": ["config.throttling.UserThrottle"],
    "EXCEPTION_HANDLER": "config.api.exception_handler",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Compute Catalog API",
    "DESCRIPTION": "Self-service GPU/NPU compute: catalog, projects and quotas, requests, approvals.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI assets ship with the package: the docs page works with no internet access.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "AcceleratorKindEnum": "catalog.choices.AcceleratorKind",
        "ServiceKindEnum": "catalog.choices.ServiceKind",
        "SliceKindEnum": "catalog.choices.SliceKind",
        "RequestStateEnum": "requests.choices.RequestState",
        "ApprovalStateEnum": "requests.choices.ApprovalState",
        "StageStateEnum": "requests.choices.StageState",
        "ChangeStateEnum": "requests.choices.ChangeState",
    },
}

REDIS_URL = env_str("REDIS_URL")
Q_CLUSTER = {
    "name": env_str("Q_CLUSTER_NAME", "compute-catalog"),
    "workers": env_int("Q_WORKERS", 2),
    "timeout": env_int("Q_TIMEOUT", 300),
    "retry": env_int("Q_RETRY", 360),
    "max_attempts": 3,
    "queue_limit": 50,
    "bulk": 10,
    "catch_up": False,
    "label": "Task queue",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"
# The gateway's rate-limit counters live here: shared through Redis when scaled out, in process for the demo.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    if REDIS_URL
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

# --- Background work that survives crashes, stops cleanly and shares SQLite (docs/provisioning.md) ---------------
# A running step holds a lease this long and renews it every third of it; a crashed worker's step is taken over
# once it lapses (the minute sweeper), no matter how long the step's own timeout is.
PROVISIONING_LEASE_SECONDS = env_int("PROVISIONING_LEASE_SECONDS", 30)
# On SIGTERM a qcluster hands back what it pulled and tells its workers to stop; one still busy after this is
# terminated (config/workers.py).
Q_STOP_GRACE_SECONDS = env_float("Q_STOP_GRACE_SECONDS", 5.0)
# The embedded SQLite demo runs the web server and a qcluster's workers against one file. WAL lets readers work while
# one writes; IMMEDIATE transactions take the write lock when they begin, so a transaction never fails on upgrading
# a read to a write (that fails at once, whatever the busy timeout); writers queue for up to the busy timeout.
SQLITE_BUSY_TIMEOUT_SECONDS = env_int("SQLITE_BUSY_TIMEOUT_SECONDS", 20)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
        "transaction_mode": "IMMEDIATE",
        "timeout": SQLITE_BUSY_TIMEOUT_SECONDS,
    }
    # Covering indexes (INCLUDE columns) are a PostgreSQL speed-up; SQLite builds the same index on its key columns.
    SILENCED_SYSTEM_CHECKS = ["models.W040"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # django-axes logs every sign-in at INFO; its warnings (failures, lockouts) are what operators need.
    "loggers": {"axes": {"level": env_str("AXES_LOG_LEVEL", "WARNING")}},
}

# --- Security (docs/security.md) ---------------------------------------------------------------------------------
# Who the client is (config.client_address): the peer, unless it is a trusted proxy, in which case the address it
# put in X-Forwarded-For. Trusted: the first TRUSTED_PROXY_COUNT hops in front of the app, and any hop whose address
# is in TRUSTED_PROXY_CIDRS. Set one of them only when a proxy you run always rewrites X-Forwarded-For.
TRUSTED_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 0)
TRUSTED_PROXY_CIDRS = env_list("TRUSTED_PROXY_CIDRS")
# API throttles ("<n>/<second|minute|hour|day>"; empty: unlimited), counted per user or per client address.
API_THROTTLE_USER_RATE = env_str("API_THROTTLE_USER_RATE", "1200/min")
API_THROTTLE_SIGN_IN_RATE = env_str("API_THROTTLE_SIGN_IN_RATE", "30/min")
API_THROTTLE_INSTALLER_RATE = env_str("API_THROTTLE_INSTALLER_RATE", "120/min")
# `cc login`'s device sign-in endpoints (POST /api/v1/auth/device/ and .../token/), per client address.
API_THROTTLE_DEVICE_RATE = env_str("API_THROTTLE_DEVICE_RATE", "60/min")
# Sign-in lockout (django-axes, on the sign-in page, the operator console and POST /api/v1/auth/token/): after
# SIGN_IN_FAILURE_LIMIT failures an account, and separately a client address, is refused (429) for
# SIGN_IN_LOCKOUT_MINUTES, counted again from each further try (0: until an operator clears it in the console).
SIGN_IN_FAILURE_LIMIT = env_int("SIGN_IN_FAILURE_LIMIT", 10)
SIGN_IN_LOCKOUT_MINUTES = env_int("SIGN_IN_LOCKOUT_MINUTES", 30)
AXES_FAILURE_LIMIT = SIGN_IN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=SIGN_IN_LOCKOUT_MINUTES) if SIGN_IN_LOCKOUT_MINUTES else None
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either alone locks: one account, or one address spraying
AXES_CLIENT_IP_CALLABLE = "config.client_address.client_address"
AXES_LOCKOUT_CALLABLE = "config.signin.lockout_response"
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ACCESS_FAILURE_LOG = True
# API tokens (tenancy.api_tokens): a new token lives API_TOKEN_DEFAULT_DAYS unless its creator asks for another
# lifetime of at most API_TOKEN_MAX_DAYS.
API_TOKEN_DEFAULT_DAYS = env_int("API_TOKEN_DEFAULT_DAYS", 90)
API_TOKEN_MAX_DAYS = env_int("API_TOKEN_MAX_DAYS", 365)
# A token that expired or was revoked this long ago is deleted by a daily schedule (its audit rows stay).
API_TOKEN_RETENTION_DAYS = env_int("API_TOKEN_RETENTION_DAYS", 90)
# `cc login` with company sign-in (tenancy.device_flow, RFC 8628): the codes work DEVICE_CODE_LIFETIME_SECONDS; the
# CLI polls every DEVICE_POLL_INTERVAL_SECONDS at most; a person who types DEVICE_USER_CODE_ATTEMPTS wrong codes on
# /device/ is refused for DEVICE_USER_CODE_WINDOW_SECONDS.
DEVICE_CODE_LIFETIME_SECONDS = env_int("DEVICE_CODE_LIFETIME_SECONDS", 600)
DEVICE_POLL_INTERVAL_SECONDS = env_int("DEVICE_POLL_INTERVAL_SECONDS", 5)
DEVICE_USER_CODE_ATTEMPTS = env_int("DEVICE_USER_CODE_ATTEMPTS", 10)
DEVICE_USER_CODE_WINDOW_SECONDS = env_int("DEVICE_USER_CODE_WINDOW_SECONDS", 900)
# Content-Security-Policy (django-csp): scripts only from this origin (no inline scripts or handlers anywhere);
# styles also inline (computed bar widths, the operator console's widgets). CSP_REPORT_URI receives violations;
# CSP_REPORT_ONLY reports without enforcing (to try a change first).
_CSP_DIRECTIVES = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'", "'unsafe-inline'"],
    "img-src": ["'self'", "data:"],
    "connect-src": ["'self'"],
    "font-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
    **({"report-uri": [env_str("CSP_REPORT_URI")]} if env_str("CSP_REPORT_URI") else {}),
}
if env_bool("CSP_REPORT_ONLY", default=False):
    CONTENT_SECURITY_POLICY_REPORT_ONLY = {"DIRECTIVES": _CSP_DIRECTIVES}
else:
    CONTENT_SECURITY_POLICY = {"DIRECTIVES": _CSP_DIRECTIVES}
# Transport security outside the demo (DEMO, or DEBUG, which implies it), each on unless turned off: HTTPS redirect
# (not /healthz, which probes reach over plain HTTP), HSTS, secure cookies. Behind a TLS-terminating proxy set
# SECURE_PROXY_SSL_HEADER to the header it sets, e.g. "HTTP_X_FORWARDED_PROTO,https" (only when the proxy always
# overwrites that header).
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
if not DEMO:
    SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", default=True)
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", default=True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", default=True)
_proxy_ssl_header = env_list("SECURE_PROXY_SSL_HEADER")
if _proxy_ssl_header:
    if len(_proxy_ssl_header) != 2:
        raise ImproperlyConfigured(
            'SECURE_PROXY_SSL_HEADER must be "<META name>,<value>", e.g. HTTP_X_FORWARDED_PROTO,https'
        )
    SECURE_PROXY_SSL_HEADER = tuple(_proxy_ssl_header)

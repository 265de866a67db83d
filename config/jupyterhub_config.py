# JupyterHub on the embedded default: the cellscale control plane as a managed service,
# demo desks (groups) and users sharing one documented password, user servers as local
# processes of each user's own Unix identity. Start it with scripts/demo (or
# `jupyterhub -f config/jupyterhub_config.py`).
import os
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
repo = here.parent
state = Path(os.environ.get("CELLSCALE_STATE_DIR", repo / "var"))
hub_state = state / "hub"
hub_state.mkdir(parents=True, exist_ok=True)

SERVICE = "cellscale"
SERVICE_PORT = int(os.environ.get("CELLSCALE_SERVICE_PORT", "8090"))
SERVICE_URL = f"http://127.0.0.1:{SERVICE_PORT}"
SCOPES = {
    "custom:cellscale:submit": {"description": "Submit and cancel your cellscale jobs."},
    "custom:cellscale:read": {"description": "See your own and your desk's cellscale jobs, logs and results."},
    "custom:cellscale:admin": {"description": "Administer cellscale: every job, quotas and tenants."},
}
USER_SCOPES = ["custom:cellscale:submit", "custom:cellscale:read", f"access:services!service={SERVICE}"]
DESKS = {"desk-a": ["alice", "carol"], "desk-b": ["bob"]}

c = get_config()  # noqa: F821
c.JupyterHub.bind_url = os.environ.get("CELLSCALE_HUB_URL", "http://127.0.0.1:8000")
c.JupyterHub.hub_bind_url = os.environ.get("CELLSCALE_HUB_API_URL", "http://127.0.0.1:8081")
c.JupyterHub.db_url = f"sqlite:///{hub_state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(hub_state / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(hub_state / "proxy.pid")
proxy = repo / ".tools" / "node_modules" / ".bin" / "configurable-http-proxy"
if proxy.exists():
    c.ConfigurableHTTPProxy.command = [str(proxy)]
c.ConfigurableHTTPProxy.api_url = os.environ.get("CELLSCALE_PROXY_API_URL", "http://127.0.0.1:8001")

# Demo sign-in: every listed user shares one password (documented in the README).
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = os.environ.get("CELLSCALE_DEMO_PASSWORD", "cellscale-demo")
# Hub admins (the admin page) sign in only with the admin password: JupyterHub wants 32+
# characters, different from the users' password; without one, `admin` could never sign in.
c.SharedPasswordAuthenticator.admin_password = os.environ.get(
    "CELLSCALE_DEMO_ADMIN_PASSWORD", "cellscale-demo-admin-password-for-local-use"
)
c.Authenticator.allowed_users = {user for users in DESKS.values() for user in users} | {"dave"}
c.Authenticator.admin_users = {"admin"}
c.JupyterHub.load_groups = {desk: {"users": users} for desk, users in DESKS.items()}

# User servers: local processes; a user's kernels call the control plane as that user.
# As root (the production shape, and scripts/demo), each server runs as the user's own Unix
# identity in their private home (LocalProcessSpawner; `cellscale dev users` creates the demo
# users), and the control plane runs local jobs as their owners too: the OS keeps users apart.
# Not root: every server and job shares this one Unix user (SINGLE-USER MODE: not for a
# machine shared by several people).
if os.getuid() == 0:
    from cellscale_hub.dev.users import ensure_users, share_python

    ensure_users(sorted(c.Authenticator.allowed_users | c.Authenticator.admin_users))  # idempotent
    share_python()
    c.JupyterHub.spawner_class = "localprocess"
else:
    print(
        "cellscale demo: SINGLE-USER MODE (the hub is not root): every user's server and job runs as "
        f"Unix user {os.environ.get('USER', os.getuid())} and can read the others' files. Run the hub as root "
        "for users kept apart by the OS.",
        file=sys.stderr,
    )
    c.JupyterHub.spawner_class = "simple"
    c.SimpleLocalProcessSpawner.home_dir_template = str(state / "homes" / "{username}")
c.Spawner.default_url = "/lab"
c.Spawner.cmd = [str(Path(sys.executable).with_name("jupyterhub-singleuser"))]
c.Spawner.environment = {"CELLSCALE_URL": f"{SERVICE_URL}/services/{SERVICE}/"}
c.Spawner.server_token_scopes = ["access:servers!server", "users:activity!user", *USER_SCOPES]
c.Spawner.http_timeout = 60
c.Spawner.start_timeout = 120

# Authorization: custom scopes for the control plane, granted to every user.
c.JupyterHub.custom_scopes = SCOPES
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", *USER_SCOPES]},
    {"name": "cellscale-admins", "users": ["admin"], "scopes": ["custom:cellscale:admin", *USER_SCOPES]},
    {
        "name": "cellscale-service",
        "services": [SERVICE],
        "scopes": ["read:users", "read:groups", "list:users", "list:groups"],
    },
]

c.JupyterHub.services = [
    {
        "name": SERVICE,
        "url": SERVICE_URL,
        "command": [sys.executable, "-m", "cellscale_hub", "--config", str(here / "cellscale_config.py")],
        # No "Authorize cellscale?" page: a silent sign-in (an <img> on any page of this site) only
        # gives the visitor's own browser a session that can change nothing without the control
        # plane's own page (X-CSRF-Token + Origin check, docs/security.md). Turn it off if that changes.
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": list(SCOPES),
        "environment": {k: v for k, v in os.environ.items() if k.startswith("CELLSCALE_")},
        "display": True,
    }
]

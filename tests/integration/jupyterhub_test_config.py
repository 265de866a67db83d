# A hub configuration from config/ (the demo's by default; CELLSCALE_TEST_HUB_BASE picks
# another), plus an admin service whose token the tests use to create users' tokens and
# start their servers.
import os
import shutil
import tempfile
from pathlib import Path

base = os.environ.get("CELLSCALE_TEST_HUB_BASE", "jupyterhub_config.py")
load_subconfig(str(Path(__file__).resolve().parents[2] / "config" / base))  # noqa: F821

c = get_config()  # noqa: F821
c.JupyterHub.services.append({"name": "test-admin", "api_token": os.environ["CELLSCALE_TEST_ADMIN_TOKEN"]})
c.JupyterHub.load_roles.append(
    {
        "name": "test-admin",
        "services": ["test-admin"],
        "scopes": ["admin:users", "admin:servers", "tokens", "access:servers", "list:users", "read:users"],
    }
)
c.Authenticator.allowed_users |= {"erin"}
if os.getuid() == 0:  # servers run as their users (config/jupyterhub_config.py): erin is one too
    from cellscale_hub.dev.users import ensure_users

    ensure_users(["erin"])

# JupyterLab as the checkout configures it (config/labconfig: no news prompt, its
# announcements plugin disabled), not as the venv's installed copy does: its labconfig/ in a
# JUPYTER_CONFIG_PATH folder, which every user server reads (a folder every user may read:
# their servers run as themselves).
lab_config = Path(tempfile.mkdtemp(prefix="cellscale-lab-config-"))
lab_config.chmod(0o755)
shutil.copytree(Path(__file__).resolve().parents[2] / "config" / "labconfig", lab_config / "labconfig")
(lab_config / "labconfig").chmod(0o755)
c.Spawner.environment["JUPYTER_CONFIG_PATH"] = str(lab_config)

# The checkout under test, not the one the venv's editable install points at (a git worktree
# shares its main checkout's .venv, and the hub passes no PYTHONPATH on): its packages for the
# processes the hub starts (the control plane, user servers and their kernels; jobs get a
# clean environment of their own), and its built side panel for JupyterLab, ahead of the
# installed copy (JUPYTER_PATH comes first in JupyterLab's search; `jlpm build` in
# labextension/ makes labextension/prebuilt). In the main checkout both are what is installed.
checkout = Path(__file__).resolve().parents[2]
python_path = os.pathsep.join(str(checkout / package) for package in ("kernels", "hub", "extension"))
c.Spawner.environment["PYTHONPATH"] = python_path
for service in c.JupyterHub.services:
    if service["name"] == "cellscale":
        service.setdefault("environment", {})["PYTHONPATH"] = python_path
panel = checkout / "labextension" / "prebuilt"
if (panel / "package.json").is_file():
    lab_data = Path(tempfile.mkdtemp(prefix="cellscale-lab-data-"))
    lab_data.chmod(0o755)
    (lab_data / "labextensions").mkdir(mode=0o755)
    shutil.copytree(panel, lab_data / "labextensions" / "cellscale-labextension")  # a copy: servers run as users
    c.Spawner.environment["JUPYTER_PATH"] = str(lab_data)

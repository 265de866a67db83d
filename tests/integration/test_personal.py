"""Outside a hub, with nothing configured: %%cluster in a terminal IPython starts (then
reuses) a personal control plane on this machine, like ray.init(); the CLI uses it too."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
CELL = "import os\nn = base + len(os.environ['CUDA_VISIBLE_DEVICES'].split(','))\nprint('computed', n)\n"
SESSION = f"""
ip = get_ipython()
ip.run_line_magic("load_ext", "cellscale")
base = 40
ip.run_cell_magic("cluster", "--gpus 2 --launcher plain --outputs n --inputs base", {CELL!r})
print("RESULT", n)
"""


@pytest.fixture
def personal_home(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CELLSCALE_URL", "JUPYTERHUB_API_TOKEN")}
    env["CELLSCALE_HOME"] = str(tmp_path / "home")
    yield env
    server = tmp_path / "home" / "personal" / "server.json"
    if server.exists():
        pid = json.loads(server.read_text())["pid"]
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)


def ipython(env, session: str = SESSION) -> str:
    """A terminal IPython (TerminalInteractiveShell) running the session script."""
    path = Path(env["CELLSCALE_HOME"]).parent / "session.ipy"
    path.write_text(session)
    run = subprocess.run(
        [str(BIN / "ipython"), "--no-banner", "--colors=NoColor", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    return run.stdout + run.stderr


def test_terminal_ipython_starts_then_reuses_a_personal_control_plane(personal_home):
    first = ipython(personal_home)
    assert "[rank 0] computed 42" in first and "RESULT 42" in first, first
    server = Path(personal_home["CELLSCALE_HOME"]) / "personal" / "server.json"
    info = json.loads(server.read_text())
    assert oct(server.stat().st_mode & 0o777) == "0o600"
    second = ipython(personal_home)
    assert "RESULT 42" in second, second
    assert json.loads(server.read_text())["pid"] == info["pid"]  # reused, not restarted

    cli = [str(BIN / "cellscale")]
    listing = subprocess.run([*cli, "list"], env=personal_home, capture_output=True, text=True, timeout=60)
    assert listing.stdout.count("SUCCEEDED") == 2, listing
    # a terminal IPython's cell is named by its first meaningful line (the import skipped; the list cuts it at 40)
    title = re.escape("n = base + len(os.environ['CUDA_VISIBLE…")
    titled = [
        line for line in listing.stdout.splitlines() if re.match(rf"^cs-[0-9a-f]{{12}}  {title}  SUCCEEDED · ", line)
    ]
    assert len(titled) == 2, listing
    script = Path(personal_home["CELLSCALE_HOME"]) / "job.py"
    script.write_text("print('from the cli')\nraise SystemExit(3)\n")
    run = subprocess.run(
        [*cli, "submit", str(script), "--launcher", "plain"],
        env=personal_home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and "[rank 0] from the cli" in run.stdout and "FAILED" in run.stderr, run
    bad = subprocess.run(
        [*cli, "submit", str(script), "--gpu", "2"], env=personal_home, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "did you mean --gpus" in bad.stderr


MAP_SESSION = """
import cellscale
sweep = cellscale.map(lambda a, b: {"sq": a * a + b}, {"a": [1, 2, 3], "b": [0, 10]}, max_parallel=2).wait()
print("SQ", sweep.df["sq"].tolist())
print("STATUS", sorted(set(sweep.df["status"])))
"""


def test_a_sweep_from_the_command_line_and_from_code(personal_home):
    home = Path(personal_home["CELLSCALE_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    grid = home / "grid.csv"
    grid.write_text("lr,seed\n0.1,0\n0.1,1\n0.2,0\n0.2,1\n")
    script = home / "point.py"
    script.write_text("pnl = lr * 100 + seed\nif (lr, seed) == (0.2, 1):\n    raise ValueError('diverged')\n")
    cli = [
        str(BIN / "cellscale"),
        "submit",
        str(script),
        "--sweep",
        str(grid),
        "--max-parallel",
        "2",
        "--outputs",
        "pnl",
    ]
    first = subprocess.run(cli, env=personal_home, capture_output=True, timeout=180)  # bytes: \r stays \r
    stderr = first.stderr.decode()
    assert first.returncode == 1, first  # one point failed
    assert "1 of 4 points failed" in stderr and "point 3 (lr=0.2, seed=1): ValueError: diverged" in stderr
    assert stderr.count("\n") == 4, stderr  # the submit, ONE progress line (rewritten with \r), the summary
    again = subprocess.run(cli, env=personal_home, capture_output=True, text=True, timeout=180)
    assert again.returncode == 1 and "1 of 4 points failed" in again.stderr  # only the failed point ran again
    job_id = again.stdout.split()[0]
    status = subprocess.run(
        [str(BIN / "cellscale"), "status", job_id], env=personal_home, capture_output=True, text=True, timeout=60
    )
    assert json.loads(status.stdout)["sweep"]["cached"] == 3, status

    out = ipython(personal_home, MAP_SESSION)
    assert "SQ [1, 11, 4, 14, 9, 19]" in out and "STATUS ['done']" in out, out

"""Outside a hub, with nothing configured: %%cluster in a terminal IPython starts (then
reuses) a personal control plane on this machine, like ray.init(); the CLI uses it too."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
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
    # no SLURM_CONF: this machine is a workstation here (test_personal_slurm.py is the login node)
    env = {k: v for k, v in os.environ.items() if k not in ("CELLSCALE_URL", "JUPYTERHUB_API_TOKEN", "SLURM_CONF")}
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


FOLLOWED = """
import pathlib, time
for i in range(1200):
    print('tick', i, flush=True)
    if pathlib.Path({flag!r}).exists():
        break
    time.sleep(0.25)
print('finished', flush=True)
"""


def _read_until(stream, words: str, timeout: float = 60) -> str:
    """Lines of a follower's stdout until one holds `words` (a thread-free read: the follower
    prints a tick every 0.25 s, so readline never waits long)."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        seen.append(line)
        if words in line or not line:
            break
    return "".join(seen)


def _kill_plane(server: Path) -> dict:
    info = json.loads(server.read_text())
    os.kill(info["pid"], signal.SIGKILL)
    while Path(f"/proc/{info['pid']}").exists() and "zombie" not in _status(info["pid"]):
        time.sleep(0.05)
    return info


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


def test_a_restarted_personal_control_plane_keeps_its_clients(personal_home, monkeypatch):
    """kill -9 the personal control plane while `cellscale logs -f` follows a job and a Client is
    open: restarted by the CLI it keeps its address and token; restarted where its port is taken,
    the follower and the open client find it again. The job runs on and the follower sees it end."""
    home = Path(personal_home["CELLSCALE_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    flag = home / "finish"
    script = home / "ticks.py"
    script.write_text(FOLLOWED.format(flag=str(flag)))
    cli = [str(BIN / "cellscale")]
    submit = subprocess.run(
        [*cli, "submit", str(script), "--launcher", "plain", "--detach"],
        env=personal_home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submit.returncode == 0, submit
    job_id = submit.stdout.split()[0]
    follower = subprocess.Popen(
        [*cli, "logs", "-f", job_id], env=personal_home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for name in ("CELLSCALE_URL", "JUPYTERHUB_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CELLSCALE_HOME", str(home))
    from cellscale import personal
    from cellscale.client import Client

    client = Client.from_env()
    try:
        assert "tick 1" in _read_until(follower.stdout, "tick 1")
        server = home / "personal" / "server.json"
        before = _kill_plane(server)
        listing = subprocess.run([*cli, "list"], env=personal_home, capture_output=True, text=True, timeout=120)
        assert listing.returncode == 0 and job_id in listing.stdout, listing  # the CLI restarted it
        after = json.loads(server.read_text())
        assert after["pid"] != before["pid"] and (after["url"], after["token"]) == (before["url"], before["token"])
        assert client.get(job_id).phase.value == "RUNNING"

        # again, restarted by hand on another port: the open client's next call and the follower
        # (paused meanwhile, so that it does not restart the plane first) find its new address
        follower.send_signal(signal.SIGSTOP)
        _kill_plane(server)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        serve = subprocess.Popen(
            [*cli, "serve", "--personal", "--port", str(port)],
            env=personal_home,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        while not (
            json.loads(server.read_text())["pid"] == serve.pid and personal._running(json.loads(server.read_text()))
        ):
            assert serve.poll() is None, "cellscale serve --personal exited"
            time.sleep(0.1)
        moved = json.loads(server.read_text())
        assert moved["url"] == f"http://127.0.0.1:{port}/" and moved["token"] == before["token"]
        assert client.get(job_id).phase.value == "RUNNING"
        assert client.url == moved["url"]
        follower.send_signal(signal.SIGCONT)
        assert "tick" in _read_until(follower.stdout, "tick")  # streaming again, from the new address
        flag.touch()
        out, err = follower.communicate(timeout=120)
        assert follower.returncode == 0, err
        assert "finished" in out, out
    finally:
        flag.touch()
        if follower.poll() is None:
            follower.send_signal(signal.SIGCONT)
            follower.kill()
        client.close()

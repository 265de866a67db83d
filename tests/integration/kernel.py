"""Drive a kernel of a user's real Jupyter server over its websocket, as JupyterLab does,
recording when each output arrives."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import websocket


@dataclass
class Execution:
    reply: dict | None = None
    outputs: list[tuple[float, str]] = field(default_factory=list)  # (arrival time, text)

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.outputs)

    def first_arrival(self, needle: str) -> float | None:
        return next((t for t, text in self.outputs if needle in text), None)


class RemoteKernel:
    def __init__(self, base_url: str, user: str, token: str, notebook: str | None = None):
        """`notebook`: start it as JupyterLab does for an open notebook (a session with that path:
        the kernel gets JPY_SESSION_NAME); else a bare kernel."""
        self.http = httpx.Client(
            base_url=f"{base_url}/user/{user}/api/", headers={"Authorization": f"token {token}"}, timeout=60
        )
        self.session_id = None
        if notebook:
            body = {"path": notebook, "name": notebook, "type": "notebook", "kernel": {"name": "python3"}}
            session = self.http.post("sessions", json=body).raise_for_status().json()
            self.session_id, self.kernel_id = session["id"], session["kernel"]["id"]
        else:
            self.kernel_id = self.http.post("kernels", json={"name": "python3"}).raise_for_status().json()["id"]
        ws_url = f"{base_url.replace('http', 'ws', 1)}/user/{user}/api/kernels/{self.kernel_id}/channels"
        self.ws = websocket.create_connection(ws_url, header=[f"Authorization: token {token}"], timeout=600)
        self.session = uuid.uuid4().hex

    def execute(self, code: str, timeout: float = 300, on_output: Callable[[str], None] | None = None) -> Execution:
        """Run `code` and collect its outputs until the kernel is idle; `on_output` is told each
        output as it arrives (a test can act on what the cell shows while it runs)."""
        msg_id = uuid.uuid4().hex
        self.ws.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": "execute_request",
                        "session": self.session,
                        "username": "test",
                        "version": "5.3",
                        "date": "",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "channel": "shell",
                    "buffers": [],
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": True,
                        "user_expressions": {},
                        "allow_stdin": False,
                        "stop_on_error": True,
                    },
                }
            )
        )
        result, idle, deadline = Execution(), False, time.monotonic() + timeout
        while not (result.reply and idle):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply within {timeout}s; output so far:\n{result.text}")
            msg = json.loads(self.ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if msg["channel"] == "shell" and kind == "execute_reply":
                result.reply = content
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
            else:
                text = _text_of(kind, content)
                if text:
                    result.outputs.append((time.time(), text))
                    if on_output is not None:
                        on_output(text)
        return result

    def close(self) -> None:
        self.ws.close()
        self.http.delete(f"sessions/{self.session_id}" if self.session_id else f"kernels/{self.kernel_id}")
        self.http.close()


def _text_of(kind: str, content: dict) -> str:
    if kind == "stream":
        return content["text"]
    if kind == "error":
        return "\n".join(content["traceback"])
    if kind == "comm_msg":  # ipywidgets state (a sweep's progress bar): an Output widget's outputs, a label
        state = content.get("data", {}).get("state", {})
        parts = [o.get("text", "") for o in state.get("outputs", [])]
        value = state.get("value", "")  # a label's text; a progress bar's value is a number
        return "".join(parts) + (value if isinstance(value, str) else "")
    if kind in ("display_data", "update_display_data"):  # the magic's status line: a line of its own
        text = content.get("data", {}).get("text/plain", "")
        return text if not text or text.endswith("\n") else text + "\n"
    if kind == "execute_result":
        return content.get("data", {}).get("text/plain", "")
    return ""

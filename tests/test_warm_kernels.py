"""autograder/warm_kernels.py: the grader's kernels, forked from a server that imported torch, behave
as the kernels Jupyter starts itself: code runs in the folder and environment asked for, an
interrupt stops a cell, a killed client takes its kernel with it, a kernel's exit ends its client."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest
from jupyter_client import KernelManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "autograder"))
import warm_kernels  # noqa: E402

pytestmark = pytest.mark.skipif(not warm_kernels.available(), reason="warm kernels fork: Linux only")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    saved = {name: os.environ.get(name) for name in ("JUPYTER_PATH", warm_kernels.SOCKET_VARIABLE)}
    folder = tmp_path_factory.mktemp("kernels")
    process = warm_kernels.start_server(folder)
    yield process
    warm_kernels.stop_server(process, folder)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def run(client, code: str, timeout: float = 60) -> tuple[str, str]:
    """Execute ``code``; return the reply's status and what it printed."""
    printed = []
    reply = client.execute_interactive(code, timeout=timeout,
                                       output_hook=lambda m: printed.append(m["content"].get("text", "")))
    return reply["content"]["status"], "".join(printed)


def started(tmp_path, **kwargs) -> tuple[KernelManager, object]:
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(tmp_path), **kwargs)
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return manager, client


def wait_for(condition, seconds: float = 15) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_kernel_forks_warm_in_the_folder_and_environment_asked_for(server, tmp_path):
    manager, client = started(tmp_path, env={**os.environ, "COURSE_MARK": "graded"})
    try:
        (tmp_path / "helper_next_to_the_notebook.py").write_text("ANSWER = 42\n")
        status, out = run(client, "import os, sys\nprint('torch' in sys.modules, os.getppid(), os.getcwd(), "
                                  "os.environ['COURSE_MARK'])\nfrom helper_next_to_the_notebook import ANSWER\n"
                                  "print(ANSWER, 'warm_kernels' in sys.modules)")
        assert status == "ok"
        warm, parent, folder, mark, answer, server_module = out.split()
        assert warm == "True" and int(parent) == server.pid  # torch already there: forked from the server
        assert folder == str(tmp_path) and mark == "graded"
        assert (answer, server_module) == ("42", "False")  # its folder importable, the server's code not there
        assert manager.provisioner.process.pid != int(parent)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def reply_to(client, msg_id: str, timeout: float) -> dict:
    """The shell reply to request ``msg_id`` (a late reply to wait_for_ready's kernel_info requests
    can come first on a busy machine)."""
    end = time.monotonic() + timeout
    while True:
        reply = client.get_shell_msg(timeout=max(0.1, end - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def test_an_interrupt_stops_the_running_cell_and_the_kernel_goes_on(server, tmp_path):
    manager, client = started(tmp_path)
    try:
        # As nbgrader sends cells (allow_errors): a request sent with stop_on_error makes ipykernel
        # abort the requests that reach it just after its error, a race with the next cell.
        msg_id = client.execute("import time\nprint('asleep', flush=True)\ntime.sleep(60)", stop_on_error=False)
        while True:  # interrupt once the cell runs, not before it starts
            message = client.get_iopub_msg(timeout=30)
            if message["msg_type"] == "stream" and "asleep" in message["content"]["text"]:
                break
        begun = time.monotonic()
        manager.interrupt_kernel()
        reply = reply_to(client, msg_id, timeout=20)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - begun < 20
        assert run(client, "print(6 * 7)") == ("ok", "42\n")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_killing_the_client_kills_its_kernel(server, tmp_path):
    manager, client = started(tmp_path)
    _, out = run(client, "import os\nprint(os.getpid())")
    kernel = int(out)
    client.stop_channels()
    manager.shutdown_kernel(now=True)  # SIGKILL to the client, as for a kernel that does not shut down
    assert wait_for(lambda: not psutil.pid_exists(kernel) or psutil.Process(kernel).status() == psutil.STATUS_ZOMBIE)


def test_a_kernel_that_exits_ends_its_client_with_its_status(server, tmp_path):
    manager, client = started(tmp_path)
    client.execute("import os\nos._exit(3)")
    assert wait_for(lambda: not manager.is_alive())
    assert manager.provisioner.process.returncode == 3
    client.stop_channels()
    manager.cleanup_resources()


def test_without_a_server_the_client_starts_a_cold_kernel(server, tmp_path):
    env = {**os.environ, warm_kernels.SOCKET_VARIABLE: str(tmp_path / "no-server.sock")}
    manager, client = started(tmp_path, env=env)
    try:
        status, out = run(client, "import os, sys\nprint('torch' in sys.modules, os.getppid() == {})".format(server.pid))
        assert (status, out.split()) == ("ok", ["False", "False"])
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_stranger_on_the_socket_does_not_stop_the_server(server, tmp_path):
    import socket
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stranger.connect(os.environ[warm_kernels.SOCKET_VARIABLE])
    stranger.sendall(b"not a kernel request\n")
    stranger.close()
    manager, client = started(tmp_path)
    try:
        _, out = run(client, "import os\nprint(os.getppid())")
        assert int(out) == server.pid and server.poll() is None
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)

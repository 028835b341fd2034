"""Python kernels for the grader that start warm: forked from a process that has imported torch,
transformers and the course's library already.

A cold kernel spends about 5 s of CPU importing those before a student's first cell runs, and a
class is graded one notebook at a time per core. Each grading worker (``grade.py``) starts one
server here (``serve``) and points Jupyter's ``python3`` kernel spec at this file, so nbgrader's
kernel manager launches a small client instead of ``ipykernel_launcher``. The client hands its
connection file, working directory, environment and standard streams to the server, which forks;
the child sets them up and runs the ordinary ipykernel application (the same kernel, started
from another point). The client stays the process nbgrader manages: it passes every signal on
(an interrupt on a cell's timeout reaches the kernel), and exits with the kernel's status. When
the client is killed, the server kills the kernel; when the worker goes, the server and its
kernels go. Where the server cannot be reached, or off Linux, the client becomes a cold kernel.

    python autograder/warm_kernels.py serve SOCKET     the server (until its stdin closes)
    python autograder/warm_kernels.py -f CONNECTION    the client, as the kernel spec runs it
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SOCKET_VARIABLE = "SPECDEC_WARM_KERNELS"  # the server's socket, for the clients
# Imported once by the server: what every graded notebook imports first.
PRELOAD = ("torch", "transformers", "specdec_ref", "specdec_ref.zoo", "specdec_ref.grading",
           "ipykernel.kernelapp")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def available() -> bool:
    """Whether kernels can start warm here: Linux (forking a process that imported torch is safe
    there while it has run no parallel work) and not turned off with SPECDEC_GRADER_WARM_KERNELS=0."""
    return sys.platform.startswith("linux") and os.environ.get("SPECDEC_GRADER_WARM_KERNELS", "1") != "0"


def write_kernel_spec(folder: Path) -> Path:
    """A ``kernels/python3`` spec under ``folder`` that launches this file's client; put
    ``folder`` first on JUPYTER_PATH and Jupyter uses it instead of ipykernel's own."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(Path(__file__).resolve()), "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python", "interrupt_mode": "signal",
        "metadata": {"debugger": False}}, indent=1))
    return folder


def start_server(folder: Path) -> subprocess.Popen:
    """Start a server for this process's kernels: its socket and kernel spec go under
    ``folder`` (a short path: a unix socket's is at most 107 bytes), and this process's
    environment points Jupyter at them. The server ends when the returned process's stdin closes
    (at the latest when this process exits)."""
    path = folder / "kernels.sock"
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve", str(path)],
                              stdin=subprocess.PIPE)
    for _ in range(200):  # bound before it imports: a few tens of milliseconds
        if path.exists() or server.poll() is not None:
            break
        time.sleep(0.05)
    write_kernel_spec(folder)
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("JUPYTER_PATH")]))
    os.environ[SOCKET_VARIABLE] = str(path)
    return server


def stop_server(server: subprocess.Popen, folder: Path) -> None:
    """End the server (and any kernel still running) and remove its folder."""
    import shutil
    server.stdin.close()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
    shutil.rmtree(folder, ignore_errors=True)


def kernel_cpu_seconds(server: subprocess.Popen) -> float:
    """CPU seconds of the kernels the server has forked and collected so far."""
    import psutil
    try:
        times = psutil.Process(server.pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.children_user + times.children_system


# --- the server -------------------------------------------------------------------------------

def serve(path: str) -> None:
    """Listen on the unix socket ``path``, import :data:`PRELOAD`, and fork a kernel per client
    until standard input closes (the worker that started it has gone)."""
    import importlib
    import select

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # before the imports: a client that comes early waits instead of going cold
    listener.listen(8)
    for name in PRELOAD:
        importlib.import_module(name)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    kernels: dict[socket.socket, int] = {}  # client connection -> its kernel's pid
    while True:
        ready, _, _ = select.select([listener, wake_read, sys.stdin, *kernels], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 512):
            for pid in kernels.values():
                _kill(pid)
            return
        if wake_read in ready:
            os.read(wake_read, 512)
            _reap(kernels)
        for client in [c for c in ready if c in kernels]:
            if not client.recv(512):  # the client died (killed by nbgrader): so does its kernel
                _kill(kernels.pop(client))
                client.close()
        if listener in ready:
            client, _ = listener.accept()
            try:
                _, fds, _, _ = socket.recv_fds(client, 1, 3)
                request = json.loads(_read_line(client))
            except (OSError, ValueError):  # not a client of ours: it goes, the server stays
                client.close()
                continue
            pid = os.fork()
            if pid == 0:
                for fd in (listener.fileno(), wake_read, wake_write, *(c.fileno() for c in kernels)):
                    os.close(fd)
                _run_kernel(request, fds, client)
            for fd in fds:
                os.close(fd)
            kernels[client] = pid
            client.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _read_line(connection: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(65536)
        if not chunk:
            raise ConnectionError("the connection closed mid-message")
        data += chunk
    return data.decode()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(kernels: dict[socket.socket, int]) -> None:
    """Collect every ended kernel and tell its client how it ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        for client, kernel in list(kernels.items()):
            if kernel == pid:
                del kernels[client]
                try:
                    client.sendall(json.dumps({"exit": code}).encode() + b"\n")
                except OSError:
                    pass
                client.close()


def _run_kernel(request: dict, fds: list[int], client: socket.socket) -> None:
    """In the forked child: become the client's kernel (its streams, folder, environment and
    arguments), run ipykernel, and never return into the server's loop."""
    code = 1
    try:
        client.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _reseed()
        sys.argv = request["argv"]
        sys.path[0] = request["cwd"]  # as `python -m ipykernel_launcher` has it, not this file's folder
        if os.environ.get("JPY_PARENT_PID"):  # read by ipykernel at import, in the server: pass it again
            sys.argv.append(f"--IPKernelApp.parent_handle={os.environ['JPY_PARENT_PID']}")
        from ipykernel.kernelapp import launch_new_instance
        launch_new_instance()
        code = 0
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _reseed() -> None:
    """Fresh seeds for the generators seeded from the OS at import (every fork would share the
    server's); torch's default seed is fixed at import, the same in a cold kernel."""
    import random
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


# --- the client -------------------------------------------------------------------------------

def client(arguments: list[str]) -> None:
    """Have the server fork a kernel with these ipykernel arguments, pass signals on to it, and
    exit as it exits; without a server, become a cold kernel."""
    cold = [sys.executable, "-m", "ipykernel_launcher", *arguments]
    path = os.environ.get(SOCKET_VARIABLE)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        socket.send_fds(connection, [b"k"], [0, 1, 2])
        request = {"argv": ["ipykernel_launcher", *arguments], "cwd": os.getcwd(), "env": dict(os.environ)}
        connection.sendall(json.dumps(request).encode() + b"\n")
        replies = connection.makefile("rb")  # the kernel's pid, then how it ended: one line each
        pid = json.loads(replies.readline())["pid"]
    except (OSError, TypeError, ValueError, KeyError):
        os.execv(sys.executable, cold)
    for number in FORWARDED:
        signal.signal(number, lambda received, _: _signal(pid, received))
    try:
        code = json.loads(replies.readline())["exit"]
    except (OSError, ValueError, KeyError):
        code = 1
    sys.exit(code if code >= 0 else 128 - code)


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    else:
        client(sys.argv[1:])

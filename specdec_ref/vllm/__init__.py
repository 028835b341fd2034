"""Launch and measure vLLM with speculative decoding.

Four small pieces, usable on their own:

* :func:`serve_command` builds the ``vllm serve`` argument list for each
  speculative method, with the speculation settings in ``--speculative-config``
  (vLLM has no ``--draft-model`` flag, and ``--speculative-model`` was removed).
* :class:`VLLMServer` runs a server in its own process group, waits for
  ``/health``, keeps the log, and on exit stops every process it started.
* :class:`OpenAIClient` sends completions to any OpenAI-compatible server and
  times them (time to first token, inter-token latency, tokens/s).
* :class:`SpecDecodeMetrics` reads the ``vllm:spec_decode_*`` counters from
  ``/metrics`` and turns them into the course's acceptance figures.

For readers without vLLM, ``recorded`` keeps a run's results in a small JSON file with
the machine and versions that produced them (:func:`record_run`,
:func:`load_recorded_run`, :func:`recorded_label`); :class:`ScriptRun` runs a script,
such as one using vLLM's offline ``LLM`` API, in vLLM's own environment.
``recorded_metrics`` holds ``/metrics`` pages recorded from the course's own servers
(:func:`recorded_metrics`, :func:`recorded_metrics_run`), and ``parse_check`` asks vLLM's
own parser how it reads a speculative config or a ``vllm serve`` command line.

They live in ``command``, ``server``, ``client``, ``metrics`` and ``recorded``; everything
public is importable from here.  Only the standard library and tqdm are used,
so the package imports without vLLM: the server usually runs from a separate
virtual environment (``launcher``).
"""
from .client import Completion, OpenAIClient, VLLMClientError, iter_sse_data
from .command import SPECULATIVE_METHODS, resolve_model, serve_command, speculative_config
from .metrics import PrometheusSample, SpecDecodeMetrics, parse_prometheus_text
from .recorded import (
    RECORDED_FORMAT,
    ScriptRun,
    busy_cores_elsewhere,
    compile_cache_status,
    environment_versions,
    load_recorded_run,
    machine_description,
    record_run,
    recorded_label,
)
from .recorded_metrics import recorded_metrics, recorded_metrics_names, recorded_metrics_run
from .server import (VLLMServer, VLLMServerError, course_vllm_venv, cpu_env, port_in_use, process_group_members,
                     venv_launcher)

__all__ = [
    "RECORDED_FORMAT",
    "SPECULATIVE_METHODS",
    "Completion",
    "OpenAIClient",
    "PrometheusSample",
    "ScriptRun",
    "SpecDecodeMetrics",
    "VLLMClientError",
    "VLLMServer",
    "VLLMServerError",
    "busy_cores_elsewhere",
    "compile_cache_status",
    "course_vllm_venv",
    "cpu_env",
    "environment_versions",
    "iter_sse_data",
    "load_recorded_run",
    "machine_description",
    "parse_prometheus_text",
    "port_in_use",
    "process_group_members",
    "record_run",
    "recorded_label",
    "recorded_metrics",
    "recorded_metrics_names",
    "recorded_metrics_run",
    "resolve_model",
    "serve_command",
    "speculative_config",
    "venv_launcher",
]

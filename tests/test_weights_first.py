"""The eager model with few-row linear layers computed as W @ xᵀ (specdec_ref.kernels.weights_first)."""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from factories import build, noisy_copy, prompt
from specdec_ref import speculative_generate
from specdec_ref.kernels import fast
from specdec_ref.kv_cache import new_cache
from specdec_ref.kernels.weights_first import MAX_ROWS, WeightsFirstLinear, is_weights_first, weights_first


class CalledFunctions(TorchFunctionMode):
    """The torch functions called inside the block, by name (a real dispatch hook, nothing replaced)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 9])
def test_layer_computes_what_nn_linear_does(bias, rows):
    torch.manual_seed(rows)
    layer = torch.nn.Linear(48, 80, bias=bias)
    swapped = WeightsFirstLinear.from_linear(layer)
    assert swapped.weight is layer.weight and swapped.bias is layer.bias
    assert swapped.state_dict().keys() == layer.state_dict().keys()
    for shape in ((rows, 48), (1, rows, 48)):
        x = torch.randn(shape)
        out = swapped(x)
        assert out.shape == (*shape[:-1], 80)
        torch.testing.assert_close(out, layer(x), rtol=1e-5, atol=1e-5)
        assert out.is_contiguous(), "the next layer and attention expect nn.Linear's row-major output"
    assert fast.check_layer(layer, swapped) is None


@pytest.mark.parametrize("rows", [1, 2, 3, MAX_ROWS])
def test_a_few_rows_go_weights_first(rows):
    layer = WeightsFirstLinear.from_linear(torch.nn.Linear(48, 80))
    with CalledFunctions() as called:
        layer(torch.randn(1, rows, 48))
    assert "linear" not in called.names, f"{rows} row(s) went through F.linear"
    assert called.names & {"matmul", "__matmul__"}, called.names


def test_many_rows_and_other_dtypes_go_through_linear():
    layer = WeightsFirstLinear.from_linear(torch.nn.Linear(48, 80))
    with CalledFunctions() as called:
        layer(torch.randn(1, MAX_ROWS + 1, 48))
    assert "linear" in called.names, "a prefill-sized input did not use F.linear"
    half = WeightsFirstLinear.from_linear(torch.nn.Linear(48, 80, dtype=torch.bfloat16))
    with CalledFunctions() as called:
        half(torch.randn(1, 2, 48, dtype=torch.bfloat16))
    assert "linear" in called.names, "a bfloat16 input did not use F.linear"


@torch.inference_mode()
@pytest.mark.parametrize("tokens", [1, 3])
def test_attention_after_weights_first_layers_keeps_the_fused_kernel(tokens):
    """A weights-first product is column-major; handed on as it is, SDPA fell back to its unfused
    math kernel for a masked verification pass (speculative decoding on SmolLM2 ran 7 % slower)."""
    target = weights_first(build("llama", 64, 2, seed=5))
    cache = new_cache(target)
    ids = prompt(9, seed=6)
    target(ids[:, :6], past_key_values=cache, use_cache=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as ran:
        target(ids[:, 6:6 + tokens], past_key_values=cache, use_cache=True)
    kernels = {event.name for event in ran.events() if "scaled_dot_product" in event.name}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels, f"a {tokens}-token pass: {sorted(kernels)}"
    assert "aten::_scaled_dot_product_attention_math" not in kernels, f"a {tokens}-token pass ran unfused attention"


def test_the_copy_shares_every_weight_and_leaves_the_model_as_it_was():
    model = build("llama", 64, 2, seed=3)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's are
    swapped = weights_first(model)
    assert swapped is not model and is_weights_first(swapped) and not is_weights_first(model)
    layers = [m for m in swapped.modules() if isinstance(m, torch.nn.Linear)]
    assert layers and all(isinstance(m, WeightsFirstLinear) for m in layers)
    assert not any(isinstance(m, WeightsFirstLinear) for m in model.modules())
    assert swapped.lm_head.weight is swapped.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert all(a is b for a, b in zip(model.parameters(), swapped.parameters()))
    assert weights_first(swapped) is swapped
    assert "weights-first" in fast.path_name(swapped) and "weights-first" not in fast.path_name(model)
    bf16 = build("llama", 64, 2, seed=3).to(torch.bfloat16)
    assert weights_first(bf16) is bf16, "only float32 CPU layers are swapped"


@torch.inference_mode()
@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_decoding_on_weights_first_models_is_greedy_identical(k):
    target = build("llama", 64, 2, seed=11)
    draft = noisy_copy(target, 0.05, seed=12)
    fast_target, fast_draft = weights_first(target), weights_first(draft)
    ids = prompt(5, seed=13)
    stock_logits = target(ids).logits
    for rows in (1, 3):
        step = target(ids[:, :rows]).logits
        torch.testing.assert_close(fast_target(ids[:, :rows]).logits, step, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fast_target(ids).logits, stock_logits, rtol=1e-4, atol=1e-4)
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False,
                               pad_token_id=0, eos_token_id=[])
    out = speculative_generate(fast_target, fast_draft, ids, max_new_tokens=30, num_draft_tokens=k, eos_token_id=[])
    assert torch.equal(out.sequences, expected), f"k={k}"
    assert out.stats.rejections > 0 and out.stats.accepted_tokens > 0, "every path of the loop should run"


def test_load_refuses_two_kernel_choices_at_once():
    from specdec_ref import zoo

    with pytest.raises(ValueError, match="pick one"):
        zoo.load("zoo:target", fast=True, weights_first=True)


def test_bench_refuses_weights_first_off_the_cpu(capsys):
    from specdec_ref.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--path", "weights-first", "--device", "cuda"])
    assert "--path weights-first is a choice of CPU kernels" in str(exit_info.value)

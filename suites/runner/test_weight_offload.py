"""Weight offload (`LLM(..., cpu_offload_gb=N)`, runner.model.offload): outputs bit-identical with offload on and
off, for both strategies; "prefetch": the offloaded layers hold their weights in host memory and run from shared
device slots, each filled `prefetch_step` offloaded layers ahead; "uva": they run from their host copies in place
(on CUDA through device views of the pinned bytes, no device copy); the offloader attaches once, from a registry,
to one model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.tolerances import assert_exact
from runner.model.offload import OffloadConfig, create_offloader
from suites.runner import tiny_llama
from suites.runner.model_driver import greedy

SIX_LAYERS = dataclasses.replace(tiny_llama.TINY, num_hidden_layers=6)
PROMPTS = [[5, 17, 33, 2, 9, 41], [60, 3, 3, 71]]


def _offloaded(config, gb: float, step: int = 1, device="cpu", dtype=torch.float32, backend="prefetch"):
    model = tiny_llama.model(config, device, dtype, seed=4)
    create_offloader(OffloadConfig(gb, backend, step)).post_init(model)
    return model


@pytest.mark.parametrize(("backend", "step"), [("prefetch", 1), ("prefetch", 2), ("uva", 1)])
@pytest.mark.parametrize("gb", [1e-9, 1.0])  # one layer; all the budget allows (prefetch: every other one)
def test_outputs_are_bit_identical_with_offload_on_and_off(gb, backend, step):
    plain = tiny_llama.model(SIX_LAYERS, "cpu", torch.float32, seed=4)
    model = _offloaded(SIX_LAYERS, gb, step, backend=backend)
    every = [1, 3, 5] if backend == "prefetch" else [0, 1, 2, 3, 4, 5]
    assert model.offloader.offloaded == ([5] if gb < 1e-6 else every)
    tokens, logits = greedy(model, PROMPTS, 8)
    want_tokens, want_logits = greedy(plain, PROMPTS, 8)
    assert tokens == want_tokens
    assert_exact(logits, want_logits, "logits")


def test_offloaded_layers_share_slots_and_keep_host_copies():
    model = _offloaded(SIX_LAYERS, 1.0, step=1)  # layers 1, 3, 5 over 2 slots
    layers = model.model.layers
    down = [layers[i].mlp.down_proj.weight for i in (1, 3, 5)]
    assert down[0].data_ptr() == down[2].data_ptr() != down[1].data_ptr()  # slots 0, 1, 0
    assert layers[0].mlp.down_proj.weight.data_ptr() not in {d.data_ptr() for d in down}  # resident
    host = model.offloader.host[1]["mlp.down_proj.weight"]
    plain = tiny_llama.model(SIX_LAYERS, "cpu", torch.float32, seed=4)
    assert_exact(host, plain.model.layers[3].mlp.down_proj.weight.detach(), "host copy of layer 3")


def test_each_copy_is_issued_prefetch_step_offloaded_layers_ahead():
    model = _offloaded(SIX_LAYERS, 1.0, step=1)
    model.offloader.log = []
    greedy(model, PROMPTS[:1], 1)
    log = model.offloader.log
    first = log[: log.index(("run", 5)) + 1]  # the prefill forward
    assert first == [
        ("copy", 1),
        ("run", 0),
        ("run", 1),
        ("copy", 3),  # issued as layer 1 starts: overlaps layers 1 and 2
        ("run", 2),
        ("run", 3),
        ("copy", 5),
        ("run", 4),
        ("run", 5),
    ]


def test_the_offloader_attaches_once_and_only_to_a_free_model():
    model = tiny_llama.model(SIX_LAYERS, "cpu", torch.float32, seed=4)
    offloader = create_offloader(OffloadConfig(1.0))
    offloader.post_init(model)
    with pytest.raises(RuntimeError, match="attached already"):
        offloader.post_init(model)
    with pytest.raises(RuntimeError, match="has an offloader already"):
        create_offloader(OffloadConfig(1.0)).post_init(model)
    other = tiny_llama.model(SIX_LAYERS, "cpu", torch.float32, seed=4)
    create_offloader(OffloadConfig(1.0)).post_init(other)  # no shared state between offloaders
    assert other.offloader is not model.offloader


@pytest.mark.parametrize("backend", ["prefetch", "uva"])
def test_a_reload_is_refused_while_attached_and_taken_after_detach(backend):
    """Weight sync's seam: a reload into an offloaded model is refused (the weights live in the offloader's host
    copies); `detach` gives the layers storage of their own (the same outputs, no hooks left), the reload lands,
    and a new offloader attaches to the reloaded model with its outputs unchanged; the detached one stays spent."""
    from runner.model.weights import dummy_weights

    model = _offloaded(SIX_LAYERS, 1.0, backend=backend)
    offloader = model.offloader
    with pytest.raises(RuntimeError, match="load_weights: the model's weights are offloaded"):
        model.load_weights(dummy_weights(SIX_LAYERS, seed=5))
    offloader.detach()
    assert model.offloader is None and not model._forward_pre_hooks
    assert not any(layer._forward_pre_hooks for layer in model.model.layers)
    assert_exact(greedy(model, PROMPTS, 2)[1], greedy(tiny_llama.model(SIX_LAYERS, seed=4), PROMPTS, 2)[1], "logits")
    assert all(
        t.data_ptr() != h.data_ptr() for host in offloader.host for h in host.values() for t in model.parameters()
    )  # storage of its own
    model.load_weights(dummy_weights(SIX_LAYERS, seed=5))
    want = greedy(tiny_llama.model(SIX_LAYERS, seed=5), PROMPTS, 4)[1]
    assert_exact(greedy(model, PROMPTS, 4)[1], want, "logits after the reload")
    create_offloader(OffloadConfig(1.0, backend)).post_init(model)
    assert_exact(greedy(model, PROMPTS, 4)[1], want, "logits offloaded again")
    with pytest.raises(RuntimeError, match="attached already"):
        offloader.post_init(tiny_llama.model(SIX_LAYERS, seed=4))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (OffloadConfig(1.0, "disk"), r"offload_backend: must be one of \['prefetch', 'uva'\], got 'disk'"),
        (OffloadConfig(-1.0), "cpu_offload_gb: must be >= 0"),
        (OffloadConfig(1.0, prefetch_step=0), "prefetch_step: must be >= 1"),
    ],
)
def test_bad_offload_settings_are_named(config, message):
    with pytest.raises(ValueError, match=message):
        create_offloader(config)


def test_no_offload_is_no_offloader():
    assert create_offloader(OffloadConfig(0.0)) is None


@pytest.mark.parametrize("backend", ["prefetch", "uva"])
def test_llm_with_offload_gives_the_tokens_without(single_thread, backend):
    from runner import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    outputs = {}
    for gb in (0.0, 1.0):
        model = tiny_llama.model(SIX_LAYERS, "cpu", torch.float32, seed=4)
        llm = LLM(
            loaded=(model, None, SIX_LAYERS), device="cpu", dtype="float32", num_kv_blocks=32, cpu_offload_gb=gb,
            offload_backend=backend,
        )  # fmt: skip
        outputs[gb] = [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        offloader = getattr(model, "offloader", None)
        assert (offloader is not None) == (gb > 0)
        assert offloader is None or type(offloader).__name__.lower().startswith(backend)
    assert outputs[0.0] == outputs[1.0]


@pytest.mark.parametrize("backend", ["prefetch", "uva"])
@pytest.mark.parametrize("quantization", ["fp8", "fp8_block", "mxfp4", "nvfp4"])
def test_quantized_layers_offload_bit_identically(backend, quantization):
    """Offload moves what a quantized layer holds after `process_weights_after_loading` (codes, scales, the
    kernel's layouts: its parameters and buffers), and the model's logits do not move."""
    want = greedy(tiny_llama.model(SIX_LAYERS, quantization=quantization), PROMPTS, 3)[1]
    offloaded = tiny_llama.model(SIX_LAYERS, quantization=quantization)
    create_offloader(OffloadConfig(1.0, backend)).post_init(offloaded)
    held = offloaded.offloader.host[-1]
    assert {n for n, t in held.items() if t.dtype in (torch.uint8, torch.float8_e4m3fn)}  # the codes moved
    assert_exact(greedy(offloaded, PROMPTS, 3)[1], want, "logits")


def test_uva_layers_run_from_their_host_copies():
    """On the CPU a "uva" layer's tensors are its host copies themselves (the device would read them in place);
    the resident layers keep their own storage."""
    model = _offloaded(SIX_LAYERS, 1e-9, backend="uva")  # layer 5
    layers, host = model.model.layers, model.offloader.host[0]
    assert set(host) == {n for n, _ in layers[5].named_parameters()} | {n for n, _ in layers[5].named_buffers()}
    assert layers[5].mlp.down_proj.weight.data_ptr() == host["mlp.down_proj.weight"].data_ptr()
    assert layers[4].mlp.down_proj.weight.data_ptr() not in {t.data_ptr() for t in host.values()}


def test_a_device_view_needs_pinned_bytes():
    from runner.model.offload.uva import device_view

    with pytest.raises(ValueError, match="host: must be pinned and contiguous"):
        device_view(torch.zeros(4), torch.device("cuda"))


@pytest.mark.gpu_only(reason="device views of pinned host memory")
def test_gpu_uva_layers_are_views_of_pinned_host_memory(device):
    """On CUDA a "uva" layer's weights are CUDA tensors at their pinned host copies' addresses (no device copy,
    the device memory they held is freed), and the model's output is the resident model's, bit for bit."""
    config = dataclasses.replace(tiny_llama.SMALL_GPU, num_hidden_layers=6)
    plain = tiny_llama.model(config, device, torch.bfloat16, seed=4)
    _, want = greedy(plain, PROMPTS, 4, device=device)
    del plain
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    model = _offloaded(config, 1e-9, device=device, dtype=torch.bfloat16, backend="uva")
    resident = torch.cuda.memory_allocated()
    weight, host = model.model.layers[5].mlp.down_proj.weight, model.offloader.host[0]["mlp.down_proj.weight"]
    assert weight.is_cuda and host.is_pinned() and weight.data_ptr() == host.data_ptr()
    layer_bytes = sum(t.nbytes for t in model.offloader.host[0].values())
    everything = [*model.parameters(), *model.buffers()]
    assert resident - before <= sum(t.nbytes for t in everything) - layer_bytes
    _, got = greedy(model, PROMPTS, 4, device=device)
    assert_exact(got, want, "logits")


@pytest.mark.gpu_only(reason="the quantized layers' kernels reading offloaded weights")
@pytest.mark.parametrize("backend", ["prefetch", "uva"])
@pytest.mark.parametrize("quantization", ["fp8_block", "mxfp4"])
def test_gpu_quantized_kernels_read_offloaded_weights(device, backend, quantization):
    """The block-FP8 GEMMs (their weights through TMA descriptors at prefill rows) and the MXFP4 fragment kernels
    on weights in device slots (prefetch) or in pinned host memory (uva): the tokens of the resident model."""
    from runner import LLM, SamplingParams

    config = dataclasses.replace(tiny_llama.SMALL_GPU, num_hidden_layers=6)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = []
    for gb in (0.0, 1.0):
        model = tiny_llama.model(config, device, torch.bfloat16, seed=4, quantization=quantization)
        llm = LLM(
            loaded=(model, None, config), device=device, dtype=torch.bfloat16, num_kv_blocks=64, max_num_seqs=8,
            max_model_len=128, cpu_offload_gb=gb, offload_backend=backend,
        )  # fmt: skip
        outputs.append([o.token_ids for o in llm.generate(PROMPTS * 3, params, use_tqdm=False)])
        llm.close()
    assert outputs[0] == outputs[1]


@pytest.mark.gpu_only(reason="copies on a side stream, captured in CUDA graphs")
@pytest.mark.parametrize("backend", ["prefetch", "uva"])
def test_gpu_offload_with_graphs_gives_the_tokens_without(device, backend):
    from runner import LLM, SamplingParams

    config = dataclasses.replace(tiny_llama.SMALL_GPU, num_hidden_layers=6)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = {}
    for gb, eager in ((0.0, True), (1.0, True), (1.0, False)):
        model = tiny_llama.model(config, device, torch.bfloat16, seed=4)
        llm = LLM(
            loaded=(model, None, config),
            device=device,
            dtype=torch.bfloat16,
            num_kv_blocks=64,
            max_num_seqs=8,
            max_model_len=128,
            enforce_eager=eager,
            cpu_offload_gb=gb,
            offload_backend=backend,
        )
        outputs[(gb, eager)] = [o.token_ids for o in llm.generate(PROMPTS * 3, params, use_tqdm=False)]
        llm.close()
    assert outputs[(0.0, True)] == outputs[(1.0, True)] == outputs[(1.0, False)]


def test_negative_control_a_uva_layer_reading_another_layers_copy_is_caught():
    plain = tiny_llama.model(SIX_LAYERS, "cpu", torch.float32, seed=4)
    model = _offloaded(SIX_LAYERS, 1.0, backend="uva")
    model.model.layers[3].mlp.down_proj.weight.data = model.offloader.host[1]["mlp.down_proj.weight"]  # planted
    _, logits = greedy(model, PROMPTS, 1)
    _, want = greedy(plain, PROMPTS, 1)
    assert not torch.equal(logits, want)


def test_negative_control_a_slot_filled_from_the_wrong_layer_is_caught():
    plain = tiny_llama.model(SIX_LAYERS, "cpu", torch.float32, seed=4)
    model = _offloaded(SIX_LAYERS, 1.0, step=1)
    model.offloader.host[1] = model.offloader.host[0]  # planted: layer 3 runs layer 1's weights
    _, logits = greedy(model, PROMPTS, 1)
    _, want = greedy(plain, PROMPTS, 1)
    assert not torch.equal(logits, want)

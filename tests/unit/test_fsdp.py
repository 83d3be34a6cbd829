"""FSDP building blocks in one process: block detection, prefetch and activation checkpointing of
blocks, strategy knobs and their errors, mixed-precision choice, memory accounting, the resumable
sampler and weight-decay names. (The registry names are tests/e2e/test_fsdp_registry.py; the gloo
runs are tests/dist/test_fsdp_dist.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dist.checkpoint.canonical import WRAPPER_SEGMENTS
from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.measure.step_memory import measure_step, storage_bytes
from lightning_dist.models.args import ModelArgs
from lightning_dist.models.materialize import materialize
from lightning_dist.parallel.fsdp import (
    block_classes_present,
    block_modules,
    find_block_types,
    set_prefetch,
)
from lightning_dist.parallel.precision import mixed_dtypes
from lightning_dist.strategies.fsdp import TunedFSDPStrategy
from lightning_dist.strategies.fsdp2 import FSDP2Strategy

DEBUG = ModelArgs(
    dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_hidden_size=128, max_seq_len=64
)


def meta_model(args: ModelArgs = DEBUG) -> nn.Module:
    with torch.device("meta"):
        return args.build()


class UserNet(nn.Module):
    """A model written without our conventions: blocks in a ModuleList, nothing named."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3))


# --- blocks -------------------------------------------------------------------------------------


def test_blocks_are_found_for_our_model_hf_llama_and_user_models(compose):
    from lightning_dist.config import model_spec

    assert [t.__name__ for t in find_block_types(meta_model())] == ["TransformerBlock"]
    one_layer = ModelArgs(dim=64, n_layers=1, n_heads=4, vocab_size=512, max_seq_len=64)
    assert [t.__name__ for t in find_block_types(meta_model(one_layer))] == ["TransformerBlock"]
    with torch.device("meta"):
        hf = model_spec(compose("model=hf_llama")).build()
    assert [t.__name__ for t in find_block_types(hf)] == ["LlamaDecoderLayer"]
    assert block_classes_present(UserNet()) == ["Sequential"]
    assert find_block_types(nn.Linear(2, 2)) == ()


def test_named_block_class_must_exist_and_the_error_lists_the_real_ones():
    model = meta_model()
    assert find_block_types(model, ["TransformerBlock"]) == find_block_types(model)
    assert find_block_types(model, []) == ()
    with pytest.raises(
        ValueError, match=r"LlamaDecoderLayer is not in the model.*TransformerBlock"
    ):
        find_block_types(model, ["LlamaDecoderLayer"])


def test_block_modules_are_outermost_and_in_forward_order():
    model = meta_model()
    blocks = block_modules(model, find_block_types(model))
    assert blocks == [model.layers[str(i)] for i in range(4)]
    assert block_modules(model, ()) == []


def test_explicit_prefetch_reaches_the_next_blocks():
    class Recorder:
        forward = backward = None

        def set_modules_to_forward_prefetch(self, modules):
            self.forward = modules

        def set_modules_to_backward_prefetch(self, modules):
            self.backward = modules

    blocks = [Recorder() for _ in range(4)]
    set_prefetch(blocks, 2, 1)
    assert blocks[0].forward == blocks[1:3] and blocks[2].forward == [blocks[3]]
    assert blocks[3].forward is None and blocks[0].backward is None
    assert blocks[3].backward == [blocks[2]]


def test_activation_checkpointing_wraps_every_nth_block():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from lightning_dist.parallel.activation_checkpoint import apply_activation_checkpointing

    model = materialize(meta_model(), torch.device("cpu"), seed=0)
    tokens = torch.randint(0, 512, (2, 16))
    expected = model(tokens)
    apply_activation_checkpointing(model, find_block_types(model), every_n=2)
    wrapped = [isinstance(model.layers[str(i)], CheckpointWrapper) for i in range(4)]
    assert wrapped == [True, False, True, False]
    torch.testing.assert_close(model(tokens), expected, rtol=0, atol=0)
    names = {WRAPPER_SEGMENTS.sub("", n) for n, _ in model.named_parameters()}
    assert names == {n for n, _ in meta_model().named_parameters()}


# --- strategy knobs -----------------------------------------------------------------------------


def test_tuned_defaults_and_layouts():
    s = TunedFSDPStrategy()
    assert s.resolved_sharding() == "SHARD_GRAD_OP" and s._state_dict_type == "sharded"
    assert s.kwargs["limit_all_gathers"] and s.kwargs["forward_prefetch"]
    assert s.kwargs["backward_prefetch"].name == "BACKWARD_PRE" and s.kwargs["use_orig_params"]
    assert s.layout.resolve(2).degrees()["dp_shard"] == 2
    assert TunedFSDPStrategy(sharding_strategy="no_shard").layout.resolve(2).dp_replicate == 2
    hybrid = TunedFSDPStrategy(sharding_strategy="HYBRID_SHARD", hybrid_shard_size=2)
    assert (hybrid.layout.resolve(4).dp_replicate, hybrid.layout.resolve(4).dp_shard) == (2, 2)
    # Across nodes the default becomes HYBRID_SHARD: shard within a node, replicate across.
    multi = TunedFSDPStrategy()
    multi.check_run(devices=8, num_nodes=2, precision="bf16-mixed", accelerator="gpu")
    assert multi.resolved_sharding(num_nodes=2) == "HYBRID_SHARD"
    assert multi.layout_for(8, 2).degrees() == {
        "pp": 1,
        "dp_replicate": 2,
        "dp_shard": 8,
        "cp": 1,
        "tp": 1,
    }
    assert FSDP2Strategy(dp_replicate=2).layout.resolve(4).dp_shard == 2


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (
            TunedFSDPStrategy,
            {"sharding_strategy": "ZERO3"},
            r"FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD",
        ),
        (TunedFSDPStrategy, {"backward_prefetch": "early"}, r"BACKWARD_PRE, BACKWARD_POST, none"),
        (TunedFSDPStrategy, {"sharding_strategy": "FULL_SHARD", "hybrid_shard_size": 2}, "HYBRID"),
        (TunedFSDPStrategy, {"param_dtype": "int8"}, r"param_dtype='int8'"),
        (TunedFSDPStrategy, {"activation_checkpointing": -1}, "activation_checkpointing=-1"),
        (TunedFSDPStrategy, {"state_dict_type": "pickle"}, "sharded, full"),
        (FSDP2Strategy, {"reshard_after_forward": 1}, "reshard_after_forward=1"),
        (FSDP2Strategy, {"dp_replicate": 0}, "dp_replicate=0"),
        (FSDP2Strategy, {"prefetch_forward": -1}, "prefetch_forward=-1"),
    ],
)
def test_bad_knobs_fail_at_construction(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize(
    ("strategy", "run", "match"),
    [
        (
            TunedFSDPStrategy(sharding_strategy="HYBRID_SHARD", hybrid_shard_size=3),
            {"devices": 4},
            r"hybrid_shard_size=3 does not divide the world size 4; use one of 1, 2, 4",
        ),
        (TunedFSDPStrategy(cpu_offload=True), {}, r"cpu_offload=true cannot run on .*cpu"),
        (TunedFSDPStrategy(auto_wrap=["Block"]), {}, r"block classes are: TransformerBlock"),
        (TunedFSDPStrategy(param_dtype="bf16"), {}, r"param_dtype=bf16 disagrees with .*32-true"),
        (FSDP2Strategy(dp_replicate=3), {"devices": 4}, r"dp_replicate=3 does not divide .* 4"),
        (FSDP2Strategy(reshard_after_forward=4), {}, r"divides the shard group size 2"),
        (FSDP2Strategy(auto_wrap=["Foo"]), {}, r"Foo is not in the model"),
    ],
)
def test_run_checks_name_the_bad_value(strategy, run, match):
    kwargs = {
        "devices": 2,
        "num_nodes": 1,
        "precision": "32-true",
        "accelerator": "cpu",
        "model": meta_model(),
        **run,
    }
    with pytest.raises(ValueError, match=match):
        strategy.check_run(**kwargs)


def test_cpu_offload_refuses_gradient_accumulation():
    gpu_run = {"devices": 8, "num_nodes": 1, "precision": "bf16-mixed", "accelerator": "gpu"}
    strategy = TunedFSDPStrategy(cpu_offload=True)
    strategy.check_run(**gpu_run, global_batch_size=64, micro_batch_size=None)  # one micro-batch
    with pytest.raises(ValueError, match=r"cannot accumulate gradients \(4 micro-batches"):
        strategy.check_run(**gpu_run, global_batch_size=64, micro_batch_size=2)


def test_mixed_precision_is_bf16_on_gpus_and_fp32_on_cpus():
    from lightning.pytorch.plugins.precision.fsdp import FSDPPrecision

    def compute(param_dtype, precision, device_type):
        dtypes = mixed_dtypes(
            param_dtype=param_dtype,
            reduce_dtype="fp32",
            precision=precision,
            device_type=device_type,
        )
        return torch.float32 if dtypes is None else dtypes.compute

    assert compute(None, "bf16-mixed", "cuda") == torch.bfloat16
    assert compute(None, "bf16-mixed", "cpu") == torch.float32
    assert compute("fp32", "bf16-mixed", "cuda") == torch.float32
    gpu = TunedFSDPStrategy(parallel_devices=[torch.device("cuda", 0)])
    gpu.precision_plugin = FSDPPrecision("bf16-mixed")
    mp = gpu.mixed_precision_config
    assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == (
        torch.bfloat16,
        torch.float32,
        torch.float32,
    )
    cpu = TunedFSDPStrategy(parallel_devices=[torch.device("cpu")])
    cpu.precision_plugin = FSDPPrecision("bf16-mixed")
    assert cpu.mixed_precision_config is None
    # Lightning's plugin refuses norm clipping under FSDP; ours asks the root module.
    assert type(cpu.precision_plugin).__name__ == "GlobalNormFSDPPrecision"


# --- memory, resume, names ----------------------------------------------------------------------


def test_storage_bytes_counts_each_storage_once():
    base = torch.zeros(10)
    assert storage_bytes([base, base[:5], base.view(2, 5), None]) == 40
    assert storage_bytes([torch.zeros(3), torch.zeros(2, dtype=torch.float64)]) == 28


def test_measure_step_reports_model_state_exactly():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 32)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()  # creates the optimizer state, as a real run's first step does
    mem = measure_step(step, model, [opt])
    n = sum(p.numel() for p in model.parameters())
    assert (mem["params"], mem["grads"]) == (4 * n, 4 * n)
    assert mem["optimizer"] == 8 * n + 4 * 4  # exp_avg, exp_avg_sq and a step counter per tensor
    assert mem["activations"] > 0 and mem["temps"] >= 0
    assert mem["total"] >= mem["params"] + mem["grads"] + mem["optimizer"] + mem["activations"]


def test_sampler_resumes_at_the_next_step():
    full = GlobalBatchSampler(64, 8, 2, dp_rank=1, dp_size=2, seed=3)
    resumed = GlobalBatchSampler(64, 8, 2, dp_rank=1, dp_size=2, seed=3, start_step=5)
    assert list(resumed) == list(full)[5 * 2 * 2 :]  # 2 micro-steps of 2 samples per step
    resumed.set_epoch(1)  # later epochs are whole again
    full.set_epoch(1)
    assert list(resumed) == list(full)


def test_weight_decay_names_ignore_wrapper_segments():
    name = "layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.attention.wq.weight"
    assert WRAPPER_SEGMENTS.sub("", name) == "layers.0.attention.wq.weight"

"""Every private name of torch, Lightning, Hydra, OmegaConf, wandb or transformers the project
needs, in one place: `PRIVATE_NAMES` lists each (attribute, hook override, import, patch), with
whose it is, where we use it, why no public API serves and the version it was checked on; the
helpers below wrap every access, so no other module names one. A private hook that one of our
classes overrides is a class here (`ParallelStyleHook`, `MemTrackerHooks`, `ModelSetupHook`,
`ScriptLauncherHook`), mixed in before the foreign base: its override calls a public method that
our subclass implements.

`tests/unit/test_compat.py` parses every module of the package and fails on a private name that is
not listed or that is used outside this module, and checks that each listed name still exists
where its entry says, so an upgrade that moves one fails there with its name, not deep inside a
training run. Patches of public attributes (`module.forward = ...`) stay registered where they
are made. Nothing here is imported eagerly: the planner reads the package on machines without
Lightning.

Checked on torch 2.13.0, lightning 2.6.6, hydra-core 1.3.8, omegaconf 2.3.1, wandb 0.31.0 and
transformers 5.24.0 (Python 3.11).

torch 2.11 (the GPU machines' version, with Lightning 2.6.6 and Python 3.12): every torch name
below, and what our code relies on around it (`_ComputationType`'s kinds, the DCP metadata
classes, the signatures of the MemTracker methods we override and of RowwiseParallel's two
functions), is in 2.11.0 with the same signature. Checked by reading the sources of the torch
2.11.0 wheel from PyPI (its version.py names commit 70d99e99, the v2.11.0 release); the
pytorch/pytorch copy the search tools hold has no tags, and its snapshot is too large to fetch.
Two differences, neither a break: 2.13's `get_schedule_ops` takes a `defer_pp_recv` we do not
pass, and 2.13's MemTracker skips the ops DTensor's sharding propagation runs under a fake mode
of its own, which 2.11's tracks, so the meter's numbers for DTensor layouts may read higher there.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from typing_extensions import override

if TYPE_CHECKING:  # what the hook classes below are mixed into, for the type checker only
    from lightning.pytorch.strategies import ParallelStrategy as _MixedInto
    from lightning.pytorch.strategies import Strategy as _Strategy
    from torch import nn
    from torch.distributed._tools.mem_tracker import MemTracker as _MemTracker
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle as _ParallelStyle
else:
    _MixedInto = _Strategy = _MemTracker = _ParallelStyle = object

LIGHTNING_CHECKPOINT_METADATA = "meta.pt"
"""Lightning's `lightning.fabric.utilities.load._METADATA_FILENAME`: the file beside the DCP shards
of a sharded checkpoint that holds loops, schedulers and callback states. Lightning writes it
and has no public constant; `tests/unit/test_compat.py` checks the two agree."""

HF_INITIALIZED_FLAG = "_is_hf_initialized"
"""transformers marks modules and tensors it has initialised with this attribute and then skips
them in `init_weights`. After a meta-device build and `to_empty` the mark is stale, so the
adapter (models/hf.py) deletes it to have every weight drawn. No public switch exists."""


def checkpoint_wrapper_api() -> tuple[Any, Any]:
    """`(apply_activation_checkpointing, checkpoint_wrapper)` from
    `torch.distributed.algorithms._checkpoint.checkpoint_wrapper`.

    Why private: torch's only way to checkpoint existing submodules without editing the model's
    forward (models stay single-device code). FSDP's own documentation and torchtitan use it.
    """
    from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as module

    return module.apply_activation_checkpointing, module.checkpoint_wrapper


def strided_shard_class() -> type:
    """`torch.distributed.tensor.placement_types._StridedShard`: a DTensor placement in which each
    rank holds every `split_factor`-th run of a dimension's shards, not one contiguous run.

    Why private: it is the only placement that describes a fused projection split part by part
    seen as one tensor (`"colwise_fused(n)"`, parallel/fused.py: its single-device view for the
    checkpoint); FSDP2 itself places it over TP. torch has no public name for it (2.13).
    """
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard


def async_collective_tensor_class() -> type:
    """`torch.distributed._functional_collectives.AsyncCollectiveTensor`: the result of a
    collective still in flight, as tensor-parallel layers return their outputs.

    Why private: only its type tells such an output from a plain tensor, and
    parallel/compile.py must copy it before a compiled block reads it (torch 2.13).
    """
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return AsyncCollectiveTensor


def mem_tracker_class() -> type:
    """`torch.distributed._tools.mem_tracker.MemTracker`, the only tracker that splits memory
    into parameters, gradients, optimizer state and activations on any device (CPU included).

    measure/step_memory.py subclasses it with `MemTrackerHooks` (which overrides
    `_register_global_optimizer_hook`, `_update_peak_stats` and
    `_track_module_params_and_buffers`) and sets `_mod_tracker` and `_in_opt` through the
    helpers below: the closure-style optimizer step of Lightning and the pipeline's repeated
    module calls need them (see MEM_TRACKER_INTERNALS).
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    return MemTracker


def register_fake_backend() -> None:
    """Register torch's fake process-group backend (`backend="fake"`: every collective returns
    at once and leaves its tensors untouched), whose creator torch registers only in its testing
    package. Why: the dry run (measure/fake_rank.py) builds one rank of a world of thousands in
    one process; no public module registers it."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401


def clear_dtensor_caches() -> None:
    """Clear torch's DTensor caches that hold meshes (the sharding propagator's, Python and C++,
    the reshard plans, the mesh topologies) after `destroy_process_group()`, before a next
    group starts in the same process (rank 0 of a Hydra multirun trains job after job; the
    test harness runs case after case; the dry run builds rank after rank).

    torch caches the sharding of each op's output by its inputs' specs (and the plans of
    reshards), and a spec's mesh compares equal to any mesh of the same ranks, shape and dim
    names, whatever groups back it. A later job's op then gets an output spec that holds the
    earlier job's mesh, whose groups were named by a counter that `destroy_process_group()`
    resets: its next collective asks for a group name that no longer exists, or that now names
    another group ("Could not resolve the process group registered under the name 10", torch
    2.13; tests/dist/test_world.py reproduces it).

    torch keeps the Python sharding cache per thread and this clears the calling thread's only
    (on a GPU, backward runs its ops on autograd's device threads, which it does not reach;
    never run on a GPU). No public API clears them."""
    import torch

    caches = []
    try:  # a torch that moved one finds nothing to clear here, and the registry's test says so
        import torch.distributed.tensor._redistribute
        from torch.distributed.tensor import DTensor

        caches.append(DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding)
        caches.append(torch.distributed.tensor._redistribute._gen_transform_infos)
        from torch.distributed.tensor._collective_utils import MeshTopoInfo

        caches.append(MeshTopoInfo.build_from_mesh)
    except (ImportError, AttributeError):
        pass
    for cache in caches:
        if hasattr(cache, "cache_clear"):
            cache.cache_clear()
    try:
        torch._C._clear_DTensor_sharding_propagator_cache()
    except AttributeError:  # a torch without the C++ dispatch cache
        pass


def fake_tensor_mode():
    """A `torch._subclasses.fake_tensor.FakeTensorMode` that takes real inputs too: tensors
    with shapes and dtypes and no storage. Why: the dry run runs a step of a 405B-parameter
    rank on a CPU; the public meta device cannot, since FSDP2 refuses meta parameters."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def dispatch_mode_class() -> type:
    """`torch.utils._python_dispatch.TorchDispatchMode`, the base of a mode that sees every op
    below autograd: the dry run counts the collectives FSDP2, DTensor and c10d issue there.
    (`CommDebugMode` counts calls but neither bytes nor the group of each.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def schedule_ops_api():
    """`torch.distributed.pipelining._schedule_visualizer.get_schedule_ops`: the action table
    (F, B, I, W per rank and time slot) of a pipeline schedule, built without processes.

    Why private: torch's only way to read a schedule's order without a process group;
    bench/schedules.py simulates each schedule's bubble from it.
    """
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    return get_schedule_ops


MEM_TRACKER_INTERNALS = (
    "_register_global_optimizer_hook",
    "_update_peak_stats",
    "_track_module_params_and_buffers",
)
"""MemTracker methods `MemTrackerHooks` overrides (attributes `_mod_tracker`, `_in_opt` too)."""


def in_backward() -> bool:
    """Whether autograd is running a backward pass on this thread.

    `torch._C._current_graph_task_id()` is -1 outside backward; torch has no public query.
    Used by the memory meter to call a tensor created in backward a temporary.
    """
    import torch

    return torch._C._current_graph_task_id() != -1


def all_gather_single(output: Any, input: Any, group: Any = None, async_op: bool = False):
    """`torch.distributed.all_gather_single` (torch 2.13's name) where torch has it, else
    `all_gather_into_tensor`, the same collective under its earlier name (torch 2.11, 2.12)."""
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output: Any, input: Any, group: Any = None, async_op: bool = False):
    """The sum of every rank's `input`, scattered: this rank's piece into `output`
    (`torch.distributed.reduce_scatter_single`, torch 2.13's name, where torch has it, else
    `reduce_scatter_tensor`, the same collective under its earlier name: torch 2.11, 2.12)."""
    import torch.distributed as dist

    reduce = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return reduce(output, input, group=group, async_op=async_op)


def grouped_mm():
    """The grouped matmul of mixture-of-experts layers: `torch.nn.functional.grouped_mm` where
    torch has it (2.13), else the private `torch._grouped_mm` it wraps (from torch 2.8), else
    None (models/moe.py then runs its per-expert loop)."""
    import torch
    import torch.nn.functional as F

    if hasattr(F, "grouped_mm"):
        return F.grouped_mm
    try:
        return torch._grouped_mm
    except AttributeError:
        return None


def saved_tensors_hooks_active() -> bool:
    """Whether saved-tensor hooks (activation checkpointing's, CPU offload's) are in force.

    `torch._C._autograd._top_saved_tensors_default_hooks` returns the innermost pair or None;
    torch has no public query. Sequence parallelism's shard saving installs hooks of its own
    only outside others, which would otherwise stop seeing the tensors saved inside.
    """
    import torch

    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def pipeline_action_types() -> Any:
    """`torch.distributed.pipelining.schedules._ComputationType`, the kinds of actions in a
    multi-stage schedule's `pipeline_order_with_comms`.

    Why: evaluating a ZBVZeroBubble schedule runs its backward actions too and asserts; keeping
    only the forward actions (parallel/pipeline.py) needs the action kinds. No public enum.
    """
    from torch.distributed.pipelining.schedules import _ComputationType

    return _ComputationType


def pipeline_receive_slots(stage: Any, direction: str) -> dict[int, tuple]:
    """A torch `PipelineStage`'s receive slots by microbatch: `args_recv_info` (the inputs it
    receives, `direction="forward"`) or `grad_recv_info` (its outputs' gradients, "backward").

    Each slot's `buffer` is the tensor the receive writes into (None where nothing is
    received: a root input, an output without gradient). Why here: these attributes are not
    documented API (no underscore, but torch may rename them); parallel/pipeline_stage.py
    drops and remakes the buffers so a stage keeps only what is in flight.
    """
    return stage.args_recv_info if direction == "forward" else stage.grad_recv_info


def pipeline_waits_for_weight_grad(stage: Any, microbatch: int) -> bool:
    """Whether a torch `PipelineStage` still keeps `microbatch`'s inputs and output gradients
    for its weight-gradient half (`backward_state`, `dw_runner`: the zero-bubble schedules
    split backward in two). Undocumented attributes, like `pipeline_receive_slots`'."""
    return microbatch in stage.backward_state or microbatch in stage.dw_runner


def replace_hydra_child_command(child_command: Any) -> None:
    """Replace Lightning's `_hydra_subprocess_cmd` in both launcher modules.

    Lightning's own command for the ranks it starts under Hydra repeats `sys.argv`, which under
    a multirun starts the whole sweep in every child; it has no hook to change it.
    """
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    # The Trainer's launcher imports the function by name, so both modules need the fix.
    fabric_launcher._hydra_subprocess_cmd = child_command
    trainer_launcher._hydra_subprocess_cmd = child_command


def set_module_device_mesh(module: Any, mesh: Any) -> None:
    """Give a LightningModule its `device_mesh` property's value.

    Lightning's ModelParallelStrategy does exactly this (`lightning_module._device_mesh = ...`)
    in its `setup_environment`, which ours replace; the property has no public setter.
    """
    module._device_mesh = mesh


class ScriptLauncherHook(_MixedInto):
    """Mixed into a Lightning `ParallelStrategy` (strategies/mesh.py): the launcher that re-runs
    the script for the other local ranks, as Lightning's DDP and ModelParallel strategies make
    it. Lightning asks a strategy for its launcher through the private `_configure_launcher`
    hook, which sets the private `_launcher`; there is no public way."""

    @override
    def _configure_launcher(self) -> None:
        from lightning.pytorch.strategies.launchers.subprocess_script import (
            _SubprocessScriptLauncher,
        )

        env = self.cluster_environment
        assert env is not None
        if not env.creates_processes_externally:
            processes = len(self.parallel_devices or [])
            self._launcher = _SubprocessScriptLauncher(env, processes, self.num_nodes)  # type: ignore[attr-defined]


def flatten_mesh(mesh: Any, dims: tuple[str, ...], name: str) -> Any:
    """The 1-D DeviceMesh over `mesh`'s dimensions `dims` (`mesh[dims]._flatten(name)`),
    registered in the root mesh under `name`; the same mesh again on later calls.

    FSDP2 shards over dp_shard x cp (context parallelism) as one dimension, and it composes with
    TP only over a mesh of the same root; torch has no public flattening (2.13).
    """
    return mesh[dims]._flatten(name)


def unflatten_mesh(mesh: Any, dim: str, sizes: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """`mesh` with its dimension `dim` split into dimensions `names` of `sizes`, outermost first
    (`mesh._unflatten`): a mesh of the same root, so its sub-meshes compose with the root's in
    DTensors and in FSDP2 (expert parallelism splits dp_shard into (dp_shard_mod_ep, ep));
    torch has no public unflattening (2.13)."""
    return mesh._unflatten(dim, sizes, names)


def drop_wandb_anonymous(logger: Any) -> None:
    """Leave `anonymous` out of the arguments a WandbLogger passes to `wandb.init`.

    Lightning always passes `anonymous=None`, and wandb (0.31) prints "The anonymous setting has
    no effect" for any value but its own unset marker. The arguments live in
    `WandbLogger._wandb_init`; the constructor has no way to leave one out.
    """
    logger._wandb_init.pop("anonymous", None)


def wrap_hydra_errors(handler: Any) -> None:
    """Send Hydra's own configuration errors (an unknown key or config name, a bad override) to
    `handler(exception)` instead of Hydra's several lines and exit status 1.

    Hydra prints them in `hydra._internal.utils.run_and_report`, which `_run_hydra` looks up in
    its module on each call; Hydra has no hook for it. Errors of other kinds, and every error
    under `HYDRA_FULL_ERROR=1`, keep Hydra's report. Idempotent.
    """
    import os

    from hydra._internal import utils
    from hydra.errors import CompactHydraException

    original = utils.run_and_report
    if getattr(original, "_wraps_hydra_errors", False):
        return

    def run_and_report(func: Any) -> Any:
        def guarded() -> Any:
            try:
                return func()
            except CompactHydraException as e:
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                handler(e)
                raise

        return original(guarded)

    run_and_report._wraps_hydra_errors = True  # type: ignore[attr-defined]
    utils.run_and_report = run_and_report


def process_group_settings(strategy: Any) -> tuple[str, Any]:
    """`(backend, timeout)` a Lightning parallel strategy will initialise its process group with.

    Lightning keeps them in `_process_group_backend` (None: the device's default) and `_timeout`,
    with no public accessor; strategies/base.py joins the group itself under torchrun restarts
    (see cluster/elastic.py) and must use the same settings.
    """
    backend = getattr(strategy, "_process_group_backend", None)
    if backend is None:
        backend = "nccl" if strategy.root_device.type == "cuda" else "gloo"
    return backend, process_group_timeout(strategy)


def process_group_timeout(strategy: Any) -> Any:
    """The timeout (a timedelta) of a Lightning strategy's process group (see above); torch's
    default for any other object."""
    from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

    public = getattr(strategy, "timeout", None)  # ours (strategies/mesh.py) say it publicly
    return public or getattr(strategy, "_timeout", None) or default_pg_timeout


def wandb_run_started(logger: Any) -> bool:
    """Whether a WandbLogger has created its run; reading `logger.experiment` would create one.

    Lightning keeps the run in `WandbLogger._experiment` and offers no public query.
    """
    return getattr(logger, "_experiment", None) is not None


def wandb_netrc_has_key(url: str) -> bool:
    """Whether the netrc file that `wandb login` writes holds an API key for the W&B server at
    `url`, by wandb's own rule where it has one: `wandb.sdk.lib.wbauth.read_netrc_auth` (wandb
    0.31) also takes the key of the W&B host behind a CoreWeave Forge host, so a key saved for
    api.wandb.ai serves wandb 0.31's default https://api.forge.coreweave.com.

    Why not public: `wandb.login(prompt=False)`, wandb's own advice, loads its process-wide
    settings from the environment of the moment, says no in offline mode (`WANDB_MODE=offline`
    while `logger.mode=online`) and may rewrite its settings file. Without the module (another
    wandb): the netrc entry of `url`'s host.
    """
    import os
    from urllib.parse import urlsplit

    try:
        from wandb.sdk.lib.wbauth import read_netrc_auth
    except ImportError:
        import netrc

        path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
        try:
            return urlsplit(url).netloc in netrc.netrc(path).hosts
        except (OSError, netrc.NetrcParseError):
            return False
    try:
        return bool(read_netrc_auth(host=url))
    except Exception:  # wandb's AuthenticationError: a key it would refuse is no key
        return False


DCP_METADATA_RECORDS = {
    "torch.distributed.checkpoint.metadata": (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "MetadataIndex",
        "_MEM_FORMAT_ENCODING",
    ),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    "torch.serialization": ("_get_layout",),
    "torch": ("Size",),
    "pathlib": ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"),
    "collections": ("OrderedDict",),
}
"""The classes and functions a DCP `.metadata` pickle names (found by reading the pickles torch
2.13 writes for model, DTensor and flattened optimizer states). checkpoint/safe.py builds only
these (plus torch dtypes, layouts and memory formats); `_StorageInfo`, `_MEM_FORMAT_ENCODING`
and `_get_layout` are private, so if torch renames one, loading refuses every checkpoint with
that name in its message, and tests/unit/test_compat.py fails first."""


def dcp_metadata_path(reader: Any, rank: Any) -> Any:
    """`FileSystemReader._get_metadata_path(rank)`: the `.metadata` file a reader would open
    (`__<rank>.metadata` for per-rank metadata). Private; no public accessor exists."""
    return reader._get_metadata_path(rank)


def dcp_set_element() -> Any:
    """`torch.distributed.checkpoint._traverse.set_element`: puts a value at a flattened key's
    path in a nested state dict, as DCP's default load planner does for non-tensor values.
    checkpoint/safe.py replaces that planner's `load_bytes` (which unpickles with
    `weights_only=False`) and needs the same placement."""
    from torch.distributed.checkpoint._traverse import set_element

    return set_element


# --- helpers for the modules that route their accesses here -----------------------------------


def config_child(node: Any, key: Any) -> Any:
    """OmegaConf's `node._get_node(key)`: the child node itself, its interpolations unresolved
    and its value unvalidated (`node[key]` would resolve it). No public accessor exists."""
    return node._get_node(key)


def config_is_none(node: Any) -> bool:
    """OmegaConf's `node._is_none()`: whether a DictConfig or ListConfig node is set to null
    (a switched-off callback), asked without reading its content."""
    return node._is_none()


def config_is_missing(node: Any) -> bool:
    """OmegaConf's `node._is_missing()`: whether a node is `???`, asked of the node itself
    (`OmegaConf.is_missing` needs its parent and key)."""
    return node._is_missing()


class ModuleInternals(NamedTuple):
    """The live registries of an `nn.Module`: what `register_parameter`, `register_buffer` and
    `add_module` write to."""

    parameters: dict
    buffers: dict
    non_persistent_buffers: set
    modules: dict


def module_internals(module: Any) -> ModuleInternals:
    """`nn.Module._parameters`, `_buffers`, `_non_persistent_buffers_set` and `_modules`.

    checkpoint/canonical.py builds views of modules that share their entries under the very
    names (tied weights, a child held under two names, empty slots included); the public
    `named_*(recurse=False)` iterators drop duplicates and None, and a buffer's persistence has
    no public query. parallel/fused.py runs a Linear's own forward on views of its parameters,
    set in `_parameters` for the call (assigning a non-Parameter to a parameter is refused)."""
    return ModuleInternals(
        module._parameters, module._buffers, module._non_persistent_buffers_set, module._modules
    )


def attached_trainer(module: Any) -> Any:
    """A LightningModule's Trainer, or None when it has none: `LightningModule.trainer` raises
    then, and Lightning keeps the reference in `_trainer` with no public query."""
    return module._trainer


def plain_optimizer(optimizer: Any) -> Any:
    """The torch optimizer behind a `LightningOptimizer` (kept in its `_optimizer`); any other
    object as it is. The public `LightningOptimizer.optimizer` would need an isinstance check,
    so a Lightning import, in modules that read checkpoints without Lightning."""
    return getattr(optimizer, "_optimizer", optimizer)


def mem_tracker_current(tracker: Any) -> dict:
    """`MemTracker._curr_mem_snap`: bytes per device and category right now. The public
    `get_tracker_snapshot("current")` returns a copy, too slow to take on every peak."""
    return tracker._curr_mem_snap


def mem_tracker_enter_optimizer(tracker: Any) -> None:
    """Count what is allocated from now on as optimizer state: `MemTracker` sets `_in_opt` from
    its global optimizer hooks, which a closure-style step (Lightning's) fires too early."""
    tracker._in_opt = True


def mem_tracker_replace_module_hooks(tracker: Any, stand_in: Any) -> None:
    """Replace `MemTracker._mod_tracker` (the ModTracker whose module hooks keep the module
    hierarchy) by `stand_in`; a pipeline stage's repeated and nested module calls break it."""
    tracker._mod_tracker = stand_in


def sigterm_broadcast_once_per_step(trainer: Any) -> None:
    """Lightning 2.6 broadcasts a SIGTERM flag from rank 0 before every training batch
    (`_TrainingEpochLoop._broadcast_sigterm_tensor`), a collective per micro-batch; with ranks
    that run different numbers of micro-batches per step (`strategy.dp_shares`) the ranks
    would meet in mismatched collectives and hang. On this trainer it runs before the first
    micro-batch of each optimizer step only, as often on every rank. (Our Preemption callback
    handles SIGTERM itself, at step boundaries.) No public switch turns it off."""
    loop = trainer.fit_loop.epoch_loop
    broadcast = getattr(loop, "_broadcast_sigterm_tensor", None)
    if broadcast is None:  # another Lightning version: nothing per batch to align
        return

    def once_per_step() -> None:
        if loop.batch_progress.current.ready % trainer.accumulate_grad_batches == 0:
            broadcast()

    loop._broadcast_sigterm_tensor = once_per_step


def functional_collective_ops() -> Any:
    """`torch.ops._c10d_functional`, the op namespace of the functional collectives that DTensor
    and tensor parallelism issue. Selective activation checkpointing keeps an op's output by
    its handle (parallel/activation_checkpoint.py); torch has no public namespace for them."""
    import torch

    return torch.ops._c10d_functional


ATTENTION_KERNELS = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)
"""The `torch.ops.aten` kernels `scaled_dot_product_attention` dispatches to (private op names;
the public op is decomposed into one of them before selective checkpointing sees it)."""


def checkpoint_wrapped_module(module: Any) -> Any:
    """The module inside a torch checkpoint wrapper (its `_checkpoint_wrapped_module`), or None
    when `module` is no wrapper. The wrapper has no public accessor; parallel/compile.py
    compiles the wrapper in each block's place."""
    return getattr(module, "_checkpoint_wrapped_module", None)


def hf_block_class_names(module: Any) -> tuple[str, ...]:
    """The block class names a Hugging Face model lists in `_no_split_modules` (empty for any
    other module): its own word on which classes are its repeated blocks, as Accelerate reads
    it too. parallel/fsdp.py wraps and checkpoints those; transformers has no public accessor."""
    return tuple(getattr(module, "_no_split_modules", None) or ())


def run_thread_exit_hooks() -> None:
    """Run the hooks `threading` keeps for interpreter shutdown (`threading._threading_atexits`,
    newest first), as shutdown runs them before it joins the threads: concurrent.futures stops
    its workers there. runtime/process_end.py ends a process by `os._exit` after Python's own
    exit work and must run them itself; there is no public call."""
    for hook in reversed(list(threading._threading_atexits)):  # type: ignore[attr-defined]
        hook()


def run_atexit_handlers() -> None:
    """Run (and clear) the `atexit` handlers now, as interpreter exit would
    (`atexit._run_exitfuncs`): runtime/process_end.py then skips the C++ teardown with
    `os._exit`; no public call."""
    atexit._run_exitfuncs()


def colwise_input_fn(style: Any) -> Any:
    """A `ColwiseParallel` style's own input preparation, bound to its layouts (the private
    static `_prepare_input_fn`), for `distribute_module`: parallel/fused.py's column-parallel
    style prepares its input exactly as torch's does, which has no public form of it."""
    return partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts)


def rowwise_embedding_partition_fn(style: Any) -> Any:
    """A `RowwiseParallel` style's own sharding of an embedding's weight by rows (the private
    `_partition_embedding_fn`), for `distribute_module`: parallel/tp.py's vocab-parallel
    embedding shards it so; no public form."""
    return style._partition_embedding_fn


def rowwise_output_fn(style: Any) -> Any:
    """A `RowwiseParallel` style's own output redistribution (partial sums to its
    `output_layouts`), bound to its layouts (the private static `_prepare_output_fn`), for
    `distribute_module`: parallel/tp.py's vocab-parallel embedding ends as a row-parallel layer
    does; no public form."""
    return partial(style._prepare_output_fn, style.output_layouts, style.use_local_output)


def stored_precision_plugin(strategy: Any) -> Any:
    """The precision plugin set on a Lightning strategy (`Strategy._precision_plugin`), or None.
    strategies/fsdp.py overrides the public `precision_plugin` property (a default built for
    that strategy when none is set), so the stored one cannot be read through it."""
    return strategy._precision_plugin


class ParallelStyleHook(_ParallelStyle):
    """Mixed in before torch's `ParallelStyle` in a tensor-parallel style of ours:
    `parallelize_module` applies a style through its private `_apply`, the one method a custom
    style implements (torch's own styles do); here it calls the public `apply_to`, which ours
    implement instead."""

    def apply_to(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        """Parallelize `module` over `device_mesh` and return it (ParallelStyle's `_apply`)."""
        raise NotImplementedError(f"{type(self).__name__} implements no apply_to")

    @override
    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return self.apply_to(module, device_mesh)


class MemTrackerHooks(_MemTracker):
    """Mixed in before torch's `MemTracker` (see `mem_tracker_class`): its three private
    methods below are where measure/step_memory.py changes what it counts (a closure-style
    optimizer step, peak activations, FSDP1's non-leaf parameter views). Each calls a public
    method that a subclass overrides; those call MemTracker's own by default."""

    def register_optimizer_hooks(self) -> None:
        """MemTracker's `_register_global_optimizer_hook`: count optimizer state from each
        `optimizer.step()` on."""
        super()._register_global_optimizer_hook()

    def update_peak_stats(self, peak_state: Any) -> None:
        """MemTracker's `_update_peak_stats`: record a new peak of `peak_state`'s kind."""
        super()._update_peak_stats(peak_state)

    def track_module_params_and_buffers(
        self, module: nn.Module, install_grad_hooks: bool = True
    ) -> tuple[int, int]:
        """MemTracker's `_track_module_params_and_buffers`: (param, buffer) bytes of `module`,
        hooking its parameters' gradients if `install_grad_hooks`."""
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    @override
    def _register_global_optimizer_hook(self) -> None:
        self.register_optimizer_hooks()

    @override
    def _update_peak_stats(self, peak_state: Any) -> None:
        self.update_peak_stats(peak_state)

    @override
    def _track_module_params_and_buffers(
        self, module: nn.Module, install_grad_hooks: bool = True
    ) -> tuple[int, int]:
        return self.track_module_params_and_buffers(module, install_grad_hooks)


class ModelSetupHook(_Strategy):
    """Mixed in before Lightning's `FSDPStrategy` (strategies/fsdp.py): its `setup` wraps the
    model through the private `_setup_model`, and Lightning has no public hook for it; here it
    calls the public `wrap_model`, which our strategy overrides (by default Lightning's own)."""

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The model as the strategy trains it (Lightning's `_setup_model`: FSDP1-wrapped)."""
        return super()._setup_model(model)

    @override
    def _setup_model(self, model: nn.Module) -> nn.Module:
        return self.wrap_model(model)


def sigterm_broadcast_off(trainer: Any) -> Callable[[], None]:
    """Stop Lightning's SIGTERM broadcast before every training batch on this trainer, for a
    callback that owns SIGTERM and agrees on it over the ranks itself (Preemption): with its
    handler in place Lightning's flag never rises, and the broadcast is a collective per step
    that only waits for the slowest rank. Returns the function that puts it back."""
    loop = trainer.fit_loop.epoch_loop
    if not hasattr(loop, "_broadcast_sigterm_tensor"):  # another Lightning version
        return lambda: None
    own = vars(loop)
    had, previous = "_broadcast_sigterm_tensor" in own, own.get("_broadcast_sigterm_tensor")
    loop._broadcast_sigterm_tensor = lambda: None

    def restore() -> None:
        if had:
            loop._broadcast_sigterm_tensor = previous
        else:
            own.pop("_broadcast_sigterm_tensor", None)

    return restore


def torchft_quorum_id(manager: Any) -> int:
    """The id of the last quorum a torchft `Manager` took part in (-1 before its first).

    The Lighthouse bumps the id whenever a quorum's members change, so a group that finds the
    id grown by more than one since its own last quorum knows quorums were formed without it.
    torchft 0.2.0 keeps it in `Manager._quorum_id`, with no public accessor.
    """
    return int(getattr(manager, "_quorum_id", -1))


# --- the registry ------------------------------------------------------------------------------

KINDS = {
    "attribute": "read or set on a foreign object (a dotted name: a module's or a class's)",
    "hook": "a private method of a foreign base class that one of our classes overrides",
    "import": "a private module, or a private name imported from a module",
    "patch": "a foreign object's attribute replaced by a function of ours",
    "bypass": "a foreign base class's method called directly, skipping the classes between",
    "constant": "a private constant whose value we copy (checked equal by the test)",
    "pickle": "a private name that a checkpoint's pickle may hold (checkpoint/safe.py allows it)",
}

TORCH = "torch 2.13.0; 2.11.0 by source"
LIGHTNING = "lightning 2.6.6"
HYDRA = "hydra-core 1.3.8"
OMEGACONF = "omegaconf 2.3.1"
TRANSFORMERS = "transformers 5.24.0"
PYTHON = "Python 3.11.7"


@dataclass(frozen=True)
class PrivateName:
    """One private name we use. `name` is what the code names: the full dotted path for a
    module's attribute or an import, the bare attribute for one read on instances."""

    name: str
    owner: tuple[str, ...]
    """Dotted paths of the classes or modules it belongs to (each is checked to still have it)."""
    kind: str
    used_in: tuple[str, ...]
    """Modules whose code uses it, directly or through `via`."""
    why: str
    checked: str
    via: str = ""
    """The helper or constant of this module the users call instead, if any."""
    probe: str = ""
    """A dotted path that must resolve, where the owner answers any name (`torch.ops`)."""


_CLEARS = (
    "DTensor's caches, keyed by meshes equal across process groups; cleared when a "
    "group ends so the next group's meshes do not get the old groups' names"
)
_CLEARS_USED_IN = ("lightning_dist.strategies.launch", "lightning_dist.measure.fake_rank")


def _entry(name, owner, kind, used_in, why, checked, via="", probe="") -> PrivateName:
    owner = (owner,) if isinstance(owner, str) else tuple(owner)
    used_in = (used_in,) if isinstance(used_in, str) else tuple(used_in)
    return PrivateName(name, owner, kind, used_in, why, checked, via, probe)


_CKPT_WRAPPER = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
_MEM_TRACKER = "torch.distributed._tools.mem_tracker.MemTracker"
_SUBPROCESS = "strategies.launchers.subprocess_script"
_MODULE = "torch.nn.Module"
_OMEGA = ("omegaconf.DictConfig", "omegaconf.ListConfig")
_SDPA = "the attention kernels SDPA dispatches to; selective checkpointing keeps ops by handle"

_ENTRIES = (
    # --- torch: imports and module attributes -------------------------------------------------
    _entry(_CKPT_WRAPPER, "torch.distributed.algorithms._checkpoint", "import",
           "lightning_dist.parallel.activation_checkpoint",
           "the only way to checkpoint existing submodules without editing forward",
           TORCH, via="checkpoint_wrapper_api"),
    _entry("torch.distributed._functional_collectives.AsyncCollectiveTensor",
           "torch.distributed._functional_collectives", "import",
           "lightning_dist.parallel.compile",
           "tells a tensor-parallel output still in flight from a plain tensor", TORCH,
           via="async_collective_tensor_class"),
    _entry("torch.distributed.tensor.placement_types._StridedShard",
           "torch.distributed.tensor.placement_types", "import",
           ("lightning_dist.parallel.fused", "lightning_dist.checkpoint.pieces"),
           "the placement of a fused projection's parts seen as one tensor, and FSDP2's over TP",
           TORCH, via="strided_shard_class"),
    _entry(_MEM_TRACKER, "torch.distributed._tools.mem_tracker", "import",
           "lightning_dist.measure.step_memory",
           "the only tracker splitting memory into params, grads, optimizer, activations",
           TORCH, via="mem_tracker_class"),
    _entry("torch.distributed.pipelining._schedule_visualizer.get_schedule_ops",
           "torch.distributed.pipelining._schedule_visualizer", "import", "bench.schedules",
           "a schedule's action table without a process group", TORCH, via="schedule_ops_api"),
    _entry("torch.distributed.pipelining.schedules._ComputationType",
           "torch.distributed.pipelining.schedules", "import", "lightning_dist.parallel.pipeline",
           "the action kinds of pipeline_order_with_comms; no public enum", TORCH,
           via="pipeline_action_types"),
    _entry("torch.testing._internal.distributed.fake_pg", "torch.testing._internal.distributed",
           "import", "lightning_dist.measure.fake_rank",
           "registers the fake process-group backend; no public module does", TORCH,
           via="register_fake_backend"),
    _entry("torch._subclasses.fake_tensor.FakeTensorMode", "torch._subclasses.fake_tensor",
           "import", "lightning_dist.measure.fake_rank",
           "storage-free tensors that FSDP2 accepts as materialised", TORCH,
           via="fake_tensor_mode"),
    _entry("torch.utils._python_dispatch.TorchDispatchMode", "torch.utils._python_dispatch",
           "import", "lightning_dist.measure.collective_counter",
           "sees each collective with its tensors and group; no public hook does", TORCH,
           via="dispatch_mode_class"),
    _entry("torch.distributed.checkpoint._traverse.set_element",
           "torch.distributed.checkpoint._traverse", "import", "lightning_dist.checkpoint.safe",
           "the placement DCP's default load planner uses for non-tensor values", TORCH,
           via="dcp_set_element"),
    *(
        _entry(name, owner, kind, _CLEARS_USED_IN, _CLEARS, TORCH, via="clear_dtensor_caches")
        for name, owner, kind in (
            ("torch.distributed.tensor._redistribute", "torch.distributed.tensor", "import"),
            ("torch.distributed.tensor._redistribute._gen_transform_infos",
             "torch.distributed.tensor._redistribute", "attribute"),
            ("torch.distributed.tensor.DTensor._op_dispatcher", "torch.distributed.tensor.DTensor",
             "attribute"),
            ("torch.distributed.tensor._collective_utils.MeshTopoInfo",
             "torch.distributed.tensor._collective_utils", "import"),
            ("torch._C._clear_DTensor_sharding_propagator_cache", "torch._C", "attribute"),
        )
    ),  # fmt: skip
    _entry("torch._C._current_graph_task_id", "torch._C", "attribute",
           ("lightning_dist.measure.step_memory", "lightning_dist.models.moe"),
           "whether backward runs (the memory meter's temporaries; an MoE layer's forward "
           "rerun by activation checkpointing); no public query", TORCH, via="in_backward"),
    _entry("torch._grouped_mm", "torch", "attribute", "lightning_dist.models.moe",
           "the grouped matmul of MoE experts where torch has no public F.grouped_mm "
           "(before 2.13)", TORCH, via="grouped_mm"),
    _entry("torch._C._autograd._top_saved_tensors_default_hooks", "torch._C._autograd",
           "attribute", "lightning_dist.parallel.sequence_parallel",
           "whether saved-tensor hooks are in force; no public query", TORCH,
           via="saved_tensors_hooks_active"),
    _entry("torch.ops._c10d_functional", "torch.ops", "attribute",
           "lightning_dist.parallel.activation_checkpoint",
           "the functional collectives DTensor issues; selective checkpointing keeps their "
           "outputs by op handle, and there is no public namespace", TORCH,
           via="functional_collective_ops", probe="torch.ops._c10d_functional.all_reduce"),
    *(
        _entry(f"torch.ops.aten.{op}", "torch.ops.aten", "attribute",
               "lightning_dist.parallel.activation_checkpoint", _SDPA, TORCH,
               via="ATTENTION_KERNELS")
        for op in ATTENTION_KERNELS
    ),
    # --- torch: attributes and hooks on classes -------------------------------------------------
    _entry("_checkpoint_wrapped_module", f"{_CKPT_WRAPPER}.ActivationWrapper", "attribute",
           "lightning_dist.parallel.compile",
           "a checkpoint wrapper's inner module; the wrapper has no public accessor", TORCH,
           via="checkpoint_wrapped_module"),
    _entry("_parameters", _MODULE, "attribute",
           ("lightning_dist.checkpoint.canonical", "lightning_dist.parallel.fused"),
           "see module_internals", TORCH, via="module_internals"),
    _entry("_buffers", _MODULE, "attribute", "lightning_dist.checkpoint.canonical",
           "see module_internals", TORCH, via="module_internals"),
    _entry("_non_persistent_buffers_set", _MODULE, "attribute",
           "lightning_dist.checkpoint.canonical", "see module_internals", TORCH,
           via="module_internals"),
    _entry("_modules", _MODULE, "attribute",
           ("lightning_dist.checkpoint.canonical", "lightning_dist.parallel.pipeline"),
           "see module_internals; StageBlocks (a ModuleDict) redefines the dict API it would "
           "call, so reads its own children as ModuleDict itself does", TORCH,
           via="module_internals"),
    _entry("forward",
           ("torch.nn.Embedding", "torch.nn.Linear", "lightning_dist.models.moe.GroupedExperts"),
           "patch", ("lightning_dist.parallel.tp", "lightning_dist.parallel.fused",
                     "lightning_dist.parallel.expert_parallel"),
           "a vocab-parallel embedding looks up local rows, a fused projection flattens its "
           "parts, an expert-parallel rank runs its experts; only forward changes what an "
           "instance computes", TORCH),
    _entry("count_routes", "lightning_dist.models.moe.MoE", "patch",
           "lightning_dist.measure.fake_routing",
           "the dry run routes as a balanced router would: a fake tensor's bincount has no "
           "output shape, so the count seam of each MoE layer is replaced", TORCH),
    _entry("reset_parameters", "torch.nn.Linear", "patch", "lightning_dist.parallel.fused",
           "a fused projection held by parts [n, O, in] draws nn.Linear's init from in_features "
           "(torch's would read the fan-in of that shape)", TORCH),
    _entry("_apply", "torch.distributed.tensor.parallel.ParallelStyle", "hook",
           ("lightning_dist.parallel.tp", "lightning_dist.parallel.fused",
            "lightning_dist.parallel.sequence_parallel"),
           "the one method a custom tensor-parallel style implements (torch's styles do)", TORCH,
           via="ParallelStyleHook"),
    _entry("_partition_embedding_fn", "torch.distributed.tensor.parallel.RowwiseParallel",
           "attribute", "lightning_dist.parallel.tp",
           "RowwiseParallel's own sharding of an embedding, reused for the same placements",
           TORCH, via="rowwise_embedding_partition_fn"),
    _entry("_prepare_input_fn", "torch.distributed.tensor.parallel.ColwiseParallel",
           "attribute", "lightning_dist.parallel.fused",
           "ColwiseParallel's own input preparation, reused by the fused column-parallel style",
           TORCH, via="colwise_input_fn"),
    _entry("_prepare_output_fn", "torch.distributed.tensor.parallel.RowwiseParallel",
           "attribute", "lightning_dist.parallel.tp",
           "RowwiseParallel's own output redistribution, reused for the same layouts", TORCH,
           via="rowwise_output_fn"),
    _entry("_get_metadata_path", "torch.distributed.checkpoint.FileSystemReader", "attribute",
           "lightning_dist.checkpoint.safe", "the .metadata file a reader opens; no accessor",
           TORCH, via="dcp_metadata_path"),
    *(
        _entry(name, _MEM_TRACKER, kind, "lightning_dist.measure.step_memory",
               "Lightning's closure-style step and a pipeline's repeated module calls need "
               "MemTracker's internals changed (see measure/step_memory.py)", TORCH, via=via)
        for name, kind, via in (
            ("_register_global_optimizer_hook", "hook", "MemTrackerHooks"),
            ("_update_peak_stats", "hook", "MemTrackerHooks"),
            ("_track_module_params_and_buffers", "hook", "MemTrackerHooks"),
            ("_curr_mem_snap", "attribute", "mem_tracker_current"),
            ("_in_opt", "attribute", "mem_tracker_enter_optimizer"),
            ("_mod_tracker", "attribute", "mem_tracker_replace_module_hooks"),
        )
    ),
    *(
        _entry(f"{module}.{name}", module, "pickle", "lightning_dist.checkpoint.safe",
               "a DCP .metadata pickle names it; the safe loader builds only listed names",
               TORCH, via="DCP_METADATA_RECORDS")
        for module, name in (
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
            ("torch.serialization", "_get_layout"),
        )
    ),
    # --- Lightning ------------------------------------------------------------------------------
    _entry("lightning.fabric.utilities.load._METADATA_FILENAME",
           "lightning.fabric.utilities.load", "constant",
           ("lightning_dist.checkpoint.store", "lightning_dist.checkpoint.weights",
            "lightning_dist.checkpoint.format"),
           "the file of loops and callback states beside DCP shards; no public constant",
           LIGHTNING, via="LIGHTNING_CHECKPOINT_METADATA"),
    *(
        _entry(f"lightning.{pkg}.{_SUBPROCESS}._hydra_subprocess_cmd", f"lightning.{pkg}."
               f"{_SUBPROCESS}", "patch", "lightning_dist.strategies.launch",
               "Lightning's child command under Hydra reruns a whole multirun; no hook",
               LIGHTNING, via="replace_hydra_child_command")
        for pkg in ("fabric", "pytorch")
    ),
    _entry("_device_mesh", "lightning.pytorch.LightningModule", "attribute",
           "lightning_dist.strategies.mesh",
           "the module's `device_mesh` property reads it and has no setter; our "
           "setup_environment builds the mesh itself", LIGHTNING, via="set_module_device_mesh"),
    _entry("_configure_launcher", "lightning.pytorch.strategies.Strategy", "hook",
           "lightning_dist.strategies.mesh",
           "where a strategy makes the launcher that starts the other local ranks; no public "
           "hook", LIGHTNING, via="ScriptLauncherHook"),
    _entry("_launcher", "lightning.pytorch.strategies.Strategy", "attribute",
           "lightning_dist.strategies.mesh",
           "the launcher the `launcher` property returns; no setter", LIGHTNING,
           via="ScriptLauncherHook"),
    _entry("lightning.pytorch.strategies.launchers.subprocess_script._SubprocessScriptLauncher",
           "lightning.pytorch.strategies.launchers.subprocess_script", "import",
           "lightning_dist.strategies.mesh",
           "Lightning's launcher that re-runs the script per local rank (its DDP strategy's); "
           "not exported", LIGHTNING, via="ScriptLauncherHook"),
    _entry("_flatten", "torch.distributed.device_mesh.DeviceMesh", "attribute",
           ("lightning_dist.parallel.parallelize", "lightning_dist.callbacks.comm"),
           "FSDP2 shards over dp_shard x cp as one mesh dimension of the same root as tp (and "
           "the comm monitor names its group); no "
           "public flattening", "torch 2.13.0 (2.11 not checked)", via="flatten_mesh"),
    _entry("_unflatten", "torch.distributed.device_mesh.DeviceMesh", "attribute",
           "lightning_dist.parallel.expert_parallel",
           "expert parallelism splits dp_shard into (dp_shard_mod_ep, ep) as dimensions of the "
           "same root, which FSDP2 needs to shard the experts' DTensors over the first; no "
           "public unflattening", "torch 2.13.0 (2.11 not checked)", via="unflatten_mesh"),
    _entry("_setup_model", "lightning.pytorch.strategies.Strategy", "hook",
           "lightning_dist.strategies.fsdp",
           "where FSDPStrategy.setup wraps the model in FSDP1 (our wrap policy and checkpointing)",
           LIGHTNING, via="ModelSetupHook"),
    _entry("_precision_plugin", "lightning.pytorch.strategies.Strategy", "attribute",
           "lightning_dist.strategies.fsdp",
           "the stored plugin behind the `precision_plugin` property we override", LIGHTNING,
           via="stored_precision_plugin"),
    _entry("clip_grad_by_norm", "lightning.pytorch.plugins.precision.Precision", "patch",
           ("lightning_dist.strategies.mesh", "lightning_dist.strategies.sharding"),
           "Lightning clips with torch's clip_grad_norm_, which sees one pipeline stage (and "
           "under ZeRO-1 unreduced gradients); this plugin instance clips by the whole model's "
           "norm instead", LIGHTNING),
    _entry("clip_grad_by_value", "lightning.pytorch.plugins.precision.Precision", "patch",
           "lightning_dist.strategies.sharding",
           "under ZeRO-1 param.grad is the rank's unreduced gradient; this plugin instance "
           "clamps the optimizer's reduced slices instead", LIGHTNING),
    _entry("_broadcast_sigterm_tensor",
           "lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop", "patch",
           ("lightning_dist.strategies.ddp", "lightning_dist.callbacks.preemption"),
           "a broadcast before every micro-batch: once per step under strategy.dp_shares, off "
           "while Preemption owns SIGTERM (sigterm_broadcast_off); no switch exists",
           LIGHTNING, via="sigterm_broadcast_once_per_step"),
    _entry("_process_group_backend", ("lightning.pytorch.strategies.DDPStrategy",
                                      "lightning.pytorch.strategies.FSDPStrategy",
                                      "lightning.pytorch.strategies.ModelParallelStrategy"),
           "attribute", "lightning_dist.strategies.base",
           "the backend a strategy's group is made with; no public accessor", LIGHTNING,
           via="process_group_settings"),
    _entry("_quorum_id", "torchft.manager.Manager", "attribute",
           "lightning_dist.cluster.replica_groups",
           "tells a group that quorums were formed without it; no public accessor",
           "torchft 0.2.0", via="torchft_quorum_id"),
    _entry("_timeout", ("lightning.pytorch.strategies.DDPStrategy",
                        "lightning.pytorch.strategies.FSDPStrategy",
                        "lightning.pytorch.strategies.ModelParallelStrategy"),
           "attribute", "lightning_dist.strategies.base",
           "the timeout a strategy's group is made with; no public accessor", LIGHTNING,
           via="process_group_settings"),
    _entry("_trainer", "lightning.pytorch.LightningModule", "attribute", "lightning_dist.lm.module",
           "whether a Trainer is attached; `trainer` raises when not", LIGHTNING,
           via="attached_trainer"),
    _entry("_optimizer", "lightning.pytorch.core.optimizer.LightningOptimizer", "attribute",
           ("lightning_dist.checkpoint.format", "lightning_dist.strategies.sharding"),
           "see plain_optimizer", LIGHTNING, via="plain_optimizer"),
    _entry("_wandb_init", "lightning.pytorch.loggers.WandbLogger", "attribute",
           "lightning_dist.run.loggers", "the arguments for wandb.init; `anonymous` cannot be left "
           "out otherwise (wandb 0.31.0 warns on it)", LIGHTNING, via="drop_wandb_anonymous"),
    _entry("_experiment", "lightning.pytorch.loggers.WandbLogger", "attribute",
           "lightning_dist.run.loggers", "whether the run exists; `experiment` would create it",
           LIGHTNING, via="wandb_run_started"),
    # --- Hydra and OmegaConf --------------------------------------------------------------------
    _entry("hydra._internal.utils", "hydra._internal", "import", "lightning_dist.run.errors",
           "where Hydra reports its own config errors; no hook", HYDRA, via="wrap_hydra_errors"),
    _entry("run_and_report", "hydra._internal.utils", "patch", "lightning_dist.run.errors",
           "replaced (idempotently) to report config errors in one line; `_run_hydra` looks "
           "it up on each call", HYDRA, via="wrap_hydra_errors"),
    _entry("_get_node", _OMEGA, "attribute", ("lightning_dist.config.targets", "lightning_dist.run.checks"),
           "see config_child", OMEGACONF, via="config_child"),
    _entry("_is_none", _OMEGA, "attribute", ("lightning_dist.config.targets", "lightning_dist.run.checks"),
           "see config_is_none", OMEGACONF, via="config_is_none"),
    _entry("_is_missing", _OMEGA, "attribute", "lightning_dist.config.targets", "see config_is_missing",
           OMEGACONF, via="config_is_missing"),
    # --- transformers ---------------------------------------------------------------------------
    _entry("_no_split_modules", "transformers.PreTrainedModel", "attribute",
           "lightning_dist.parallel.fsdp",
           "an HF model's own list of its block classes (Accelerate reads it too)", TRANSFORMERS,
           via="hf_block_class_names"),
    _entry(HF_INITIALIZED_FLAG, "transformers.PreTrainedModel", "attribute",
           "lightning_dist.models.hf", "see HF_INITIALIZED_FLAG", TRANSFORMERS,
           via="HF_INITIALIZED_FLAG"),
    # --- the standard library -------------------------------------------------------------------
    _entry("atexit._run_exitfuncs", "atexit", "attribute", "lightning_dist.runtime.process_end",
           "runs the atexit handlers now, as interpreter exit would, before os._exit skips the "
           "C++ teardown; no public call", PYTHON, via="run_atexit_handlers"),
    _entry("threading._threading_atexits", "threading", "attribute", "lightning_dist.runtime.process_end",
           "the hooks threading's shutdown runs before joining threads (concurrent.futures "
           "stops its workers there); no public call", PYTHON, via="run_thread_exit_hooks"),
    _entry("excepthook", "sys", "patch", "lightning_dist.runtime.refusal",
           "Python's documented hook for unhandled exceptions, wrapped (the hook before is "
           "called for all but our refusals) so that a user's own script prints a refusal in "
           "one line", PYTHON),
    _entry("exec_module", "importlib.abc.Loader", "patch", "lightning_dist.runtime.strategy_names",
           "registers our strategies once lightning.pytorch has loaded, without importing it; "
           "the import system has no post-import hook", PYTHON),
)  # fmt: skip

PRIVATE_NAMES: dict[str, PrivateName] = {entry.name: entry for entry in _ENTRIES}
"""Every private name the package uses, by `PrivateName.name`."""

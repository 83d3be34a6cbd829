"""A pipeline stage that holds only the microbatches its schedule has in flight.

torch's `PipelineStage` (2.13) allocates, on the first step, one receive buffer per microbatch
for the stage's input (a non-first stage) and one for its output's gradient (a non-last stage),
and keeps all of them for good: 2 x m buffers of [mbs, seq, dim] on a middle stage, whatever the
schedule keeps in flight. Its multi-stage schedules (Interleaved1F1B, the zero-bubble ones)
also hold every send until the step ends, and a send holds its tensor: each microbatch's
output stays until the step is over, not until its backward.

`InFlightStage` changes that, on the stage's public methods only:

- a receive buffer exists from the moment its receive is posted until the backward of its
  microbatch has run (the weight half, for schedules that split it); the buffers torch made
  on the first step are dropped before the first microbatch runs, and each later one is made
  when its receive is posted, from the same shape (on a GPU the caching allocator hands the
  freed block to the next microbatch);
- the output a stage sent is freed once the backward of its microbatch has run: the receiver
  has used it by then (it computed the gradient this backward consumed), so the send is done;
  the storage is released (`untyped_storage().resize_(0)`), the way FSDP frees unsharded
  parameters, since the schedule's handle on the send still refers to the tensor;
- the input gradient a stage sent is freed, under a multi-stage schedule, once an earlier
  stage of the same rank has run that microbatch's backward: the gradient has travelled
  through every stage in between, so it arrived;
- forward only (evaluation), a microbatch's input and output are dropped once it is sent.

What is left per microbatch is what backward needs (the activations torch's autograd saves),
and under a multi-stage schedule the gradients the rank's first stage sent, which the schedule
holds until the step ends (nothing on the rank tells when they arrived).
`planner.pipeline_buffers.pipeline_bytes` counts this; bench/pipeline_memory.py measures it
against torch's own stage.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch.distributed.pipelining import PipelineStage

from lightning_dist._compat import pipeline_receive_slots, pipeline_waits_for_weight_grad

_DIRECTIONS = ("forward", "backward")


class InFlightStage(PipelineStage):
    """`PipelineStage` that frees each microbatch's buffers once its backward has run (see the
    module's docstring); constructed like it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._released: dict[tuple[str, int], list[tuple | None]] = {}
        """(direction, microbatch): the shape of each receive buffer dropped, to remake it."""
        self._sent_outputs: dict[int, list[weakref.ref]] = {}
        """microbatch: the outputs this stage sent (while a send holds them)."""
        self._sent_grads: dict[int, list[weakref.ref]] = {}
        """microbatch: the input gradients this stage sent (while a send holds them)."""
        self.rank_stages: list[InFlightStage] = [self]
        """Every stage of this rank (`link_stages`): a lower one's backward of a microbatch
        tells that this one's gradient for it has arrived."""
        self._started = False

    # --- the step's start: drop the buffers no receive has claimed -------------------------

    def clear_runtime_states(self) -> None:
        super().clear_runtime_states()
        self._sent_outputs.clear()
        self._sent_grads.clear()
        self._started = False

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        for direction in _DIRECTIONS:
            for mb, slots in pipeline_receive_slots(self, direction).items():
                if any(isinstance(getattr(s, "buffer", None), torch.Tensor) for s in slots):
                    self._released.pop((direction, mb), None)  # torch made it anew
                self._release(direction, mb)

    # --- receives: a buffer exists from its post to its backward ---------------------------

    def get_fwd_recv_ops(self, fwd_chunk_id: int):
        self._start()
        self._remake("forward", fwd_chunk_id)
        return super().get_fwd_recv_ops(fwd_chunk_id)

    def get_bwd_recv_ops(self, bwd_chunk_id: int):
        self._start()
        if self.has_backward and not self.is_last:
            self._remake("backward", bwd_chunk_id)
        return super().get_bwd_recv_ops(bwd_chunk_id)

    def set_local_fwd_input(self, prev_stage_outputs, mb_index: int) -> None:
        self._start()
        self._released.pop(("forward", mb_index), None)  # the previous stage's output is it
        super().set_local_fwd_input(prev_stage_outputs, mb_index)

    def set_local_bwd_input(self, next_stage_bwd_outputs, mb_index: int) -> None:
        self._start()
        self._remake("backward", mb_index)  # torch zeroes it where the gradient is None
        super().set_local_bwd_input(next_stage_bwd_outputs, mb_index)

    # --- compute: free the microbatch once its backward has run ----------------------------

    def forward_one_chunk(self, fwd_chunk_id: int, *args, **kwargs):
        self._start()
        output = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        if not self.has_backward and self.is_last:
            # Forward only, nothing reads the output again but the loss (which has it); the
            # schedule still asks for the last stage's (empty) sends of it.
            self.fwd_cache[fwd_chunk_id] = ((), [])
            self._release("forward", fwd_chunk_id)
        return output

    def get_fwd_send_ops(self, fwd_chunk_id: int):
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        if not self.has_backward:  # forward only: sent, and no backward will read it
            self.fwd_cache.pop(fwd_chunk_id, None)
            self._release("forward", fwd_chunk_id)
        else:
            self._sent_outputs[fwd_chunk_id] = [weakref.ref(op.tensor) for op in ops]
        return ops

    def get_bwd_send_ops(self, bwd_chunk_id: int):
        ops = super().get_bwd_send_ops(bwd_chunk_id)
        self._sent_grads[bwd_chunk_id] = [weakref.ref(op.tensor) for op in ops]
        return ops

    def backward_one_chunk(self, bwd_chunk_id: int, loss=None, *args, **kwargs) -> None:
        super().backward_one_chunk(bwd_chunk_id, loss, *args, **kwargs)
        if isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
            # The schedule keeps each microbatch's loss for the step; its graph's nodes (freed
            # of their saved tensors by backward) would still hold the received input, a leaf.
            with contextlib.suppress(RuntimeError):  # a view cannot be detached in place
                loss.detach_()
        # Each stage after this one on the rank sent its gradient of this microbatch on towards
        # this one, which has now received the result: those sends are done.
        for later in self.rank_stages:
            if later.stage_index > self.stage_index:
                later.gradient_arrived(bwd_chunk_id)
        if not pipeline_waits_for_weight_grad(self, bwd_chunk_id):
            self._finish(bwd_chunk_id)

    def backward_weight_one_chunk(self, bwd_chunk_id: int, *args, **kwargs) -> None:
        super().backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs)
        self._finish(bwd_chunk_id)

    def gradient_arrived(self, mb: int) -> None:
        """The input gradient this stage sent for microbatch `mb` has arrived: free it."""
        _free(self._sent_grads.pop(mb, ()))

    def _finish(self, mb: int) -> None:
        """Microbatch `mb`'s backward has run: drop its buffers and free what it sent."""
        for direction in _DIRECTIONS:
            self._release(direction, mb)
        _free(self._sent_outputs.pop(mb, ()))

    # --- the buffers ----------------------------------------------------------------------

    def _release(self, direction: str, mb: int) -> None:
        if (direction, mb) in self._released:
            return
        shapes: list[tuple | None] = []
        for slot in pipeline_receive_slots(self, direction).get(mb, ()):
            buffer = getattr(slot, "buffer", None)
            if isinstance(buffer, torch.Tensor) and not getattr(slot, "is_root_arg", False):
                shapes.append((buffer.size(), buffer.stride(), buffer.dtype, buffer.device))
                slot.buffer = None
            else:
                shapes.append(None)
        if any(shapes):
            self._released[direction, mb] = shapes

    def _remake(self, direction: str, mb: int) -> None:
        shapes = self._released.pop((direction, mb), None)
        if shapes is None:
            return
        slots = pipeline_receive_slots(self, direction)[mb]
        for slot, shape in zip(slots, shapes, strict=True):
            if shape is not None:
                size, stride, dtype, device = shape
                slot.buffer = torch.empty_strided(size, stride, dtype=dtype, device=device)


def link_stages(stages: list) -> None:
    """Tell each `InFlightStage` of one rank about the others (see `rank_stages`)."""
    for stage in stages:
        if isinstance(stage, InFlightStage):
            stage.rank_stages = list(stages)


def _free(sent) -> None:
    """Release the storage of each sent tensor still alive (held by its send's handle, which
    the schedule keeps to the step's end); its send is known to be done."""
    for ref in sent:
        tensor = ref()
        if tensor is not None:
            tensor.untyped_storage().resize_(0)

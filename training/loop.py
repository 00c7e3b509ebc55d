"""The per-worker training function that Ray Train runs on every rank."""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import math
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from training import checkpoint, emf, progress
from training.best_checkpoint import scored  # each checkpoint scored by its held-out loss
from training.data import Batches, BlockRange
from training.evaluate import EarlyStop, evaluate, held_out_split
from training.flops import count_params, flops_per_token, lora_flops_per_token, mfu, peak_tflops
from training.lora import apply_lora
from training.loss import count_targets, labels_and_positions
from training.loss_chunks import chunk_mem_const, default_chunk_tokens
from training.memory_plan import Dims, auto_micro_batch, auto_reshard_after_forward
from training.model import (
    apply_float8,
    apply_fsdp,
    apply_liger,
    build_model,
    check_float8_device,
    host_layout,
    make_mesh,
    precompute_float8_scales,
)
from training.netprobe import TransportGateError, host_key, run_transport_gate
from training.options import TrainOptions, profile_range
from training.precision import float8_by_default
from training.sharding import mesh_shape
from training.shards import TokenBlocks
from training.timing import StepTimer

EXPECT_ENV = "RAYTRAIN_EXPECT_TRANSPORT"
GC_EVERY = 50  # steps between the young-generation collections the loop runs itself
# Training steps a process runs with every guard evaluated before --skip-guard-eval applies: the
# first compiles the layers, the second sees the steady state (gathered parameters, grad sync).
SKIP_GUARDS_AFTER = 2


def resolve_expect(flag: str, backend: str, nodes: int, env: Mapping[str, str]) -> str:
    """What the transport gate must see. Gloo and single-node runs have no inter-node NCCL traffic
    to judge, so `auto` accepts anything there; on several GPU nodes it takes the cluster's setting.
    """
    if flag != "auto":
        return flag
    if backend != "nccl" or nodes <= 1:
        return "any"
    return env.get(EXPECT_ENV, "any") or "any"


def lr_at(step: int, opts: TrainOptions) -> float:
    """Linear warm-up, then cosine decay to 10 % of --lr. A function of the step: nothing to save."""
    if opts.warmup_steps and step < opts.warmup_steps:
        return opts.lr * (step + 1) / opts.warmup_steps
    span = max(1, opts.steps - opts.warmup_steps)
    frac = min(1.0, (step - opts.warmup_steps) / span)
    return opts.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def _liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def _torchao_installed() -> bool:
    return importlib.util.find_spec("torchao") is not None


def _gpu_memory_gib(device: torch.device) -> float:
    """The device's memory (0 on the CPU, where Liger does not run)."""
    if device.type != "cuda":
        return 0.0
    return torch.cuda.get_device_properties(device).total_memory / 2**30


def _peak_mem_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # CPU: the process's peak resident set (ru_maxrss is KiB on Linux).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def emulated_host_id(rank: int, world: int, hosts: int) -> str:
    """--emulate-hosts: contiguous blocks of ranks share an id, like ranks on one real node."""
    return f"emulated-host-{rank * hosts // world}"


def _say(line: str) -> None:
    # Not print(): Ray Train V2 patches it into a logger that shows each line twice.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class StepProfiler:
    """--profile FIRST:LAST: torch.profiler around those steps on every rank (their collectives
    stay in step); rank 0 writes the Chrome trace and a per-operator table of device time."""

    TABLE_ROWS = 40

    def __init__(self, spec: str | None, output_dir: str, rank: int, on_gpu: bool) -> None:
        self.range = profile_range(spec)
        self.dir = os.path.join(output_dir, "profile")
        self.rank, self.on_gpu = rank, on_gpu
        self.prof: Any = None

    def before_step(self, step: int) -> None:
        """`step` is the 1-based number of the step about to run."""
        if self.range is None or step != self.range[0]:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_gpu else [])
        self.prof = profile(activities=activities, record_shapes=False, with_stack=False)
        self.prof.__enter__()

    def after_step(self, step: int) -> list[str]:
        """Stops after the last profiled step; returns the files rank 0 wrote."""
        if self.prof is None or self.range is None or step != self.range[1]:
            return []
        if self.on_gpu:
            torch.cuda.synchronize()
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        if self.rank != 0:
            return []
        os.makedirs(self.dir, exist_ok=True)
        first, last = self.range
        trace = os.path.join(self.dir, f"trace-steps{first}-{last}-rank0.json.gz")
        prof.export_chrome_trace(trace)
        sort = "self_device_time_total" if self.on_gpu else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=self.TABLE_ROWS)
        table_path = os.path.join(self.dir, f"ops-steps{first}-{last}-rank0.txt")
        with open(table_path, "w") as f:
            f.write(table + "\n")
        return [trace, table_path]


def plan_options(
    opts: TrainOptions,
    *,
    shape: str | Dims,
    world: int,
    local_world: int,
    kernels: tuple[bool, bool, bool],
    capacity: int,
) -> dict[str, Any]:
    """The memory plan's arguments (training/memory_plan.py `plan`) but the micro-batch, its
    accumulation and float8, for these options, the model's `shape` (a built model's, which a
    pretrained --model decides), `world` ranks of `local_world` per node, the layers as the rank
    built them (compiled, Liger loss, Liger layers) and a GPU of `capacity` bytes. Parameters are
    planned resharded after forward unless kept by --no-reshard-after-forward: the micro-batch is
    chosen first."""
    compiled, liger, liger_layers = kernels
    mesh = mesh_shape(opts.sharding, world, local_world)
    chunk = opts.loss_chunk_tokens
    if chunk is None:
        chunk = default_chunk_tokens(capacity / 2**30)
    return dict(
        shape=shape,
        seq_len=opts.seq_len,
        shard=mesh[-1],
        communicators=0 if world == 1 else 1 if len(mesh) == 1 else 3,
        compile=compiled,
        activation_checkpointing=opts.activation_checkpointing,
        liger=liger,
        liger_layers=liger_layers,
        reshard_after_forward=opts.reshard_after_forward is not False,
        loss_chunk_tokens=chunk,
        lora=opts.lora,
    )


def planned_micro_batch(
    opts: TrainOptions,
    *,
    shape: str | Dims,
    world: int,
    local_world: int,
    kernels: tuple[bool, bool, bool],
    capacity: int,
    float8_at: Callable[[int], bool],
) -> int:
    """--micro-batch-size auto on a GPU of `capacity` bytes: the memory plan's choice
    (training/memory_plan.py auto_micro_batch); the other arguments as `plan_options`."""
    assert opts.global_batch_size is not None
    common = plan_options(
        opts, shape=shape, world=world, local_world=local_world, kernels=kernels, capacity=capacity
    )
    per_rank = opts.global_batch_size // world
    return auto_micro_batch(per_rank, capacity, lambda m: {**common, "float8": float8_at(m)})


def planned_reshard(
    opts: TrainOptions,
    *,
    shape: str | Dims,
    world: int,
    local_world: int,
    kernels: tuple[bool, bool, bool],
    capacity: int,
    micro: int,
    accum: int,
    float8: bool,
) -> bool:
    """--reshard-after-forward's default on a GPU of `capacity` bytes at the chosen micro-batch
    (training/memory_plan.py auto_reshard_after_forward); the other arguments as `plan_options`."""
    common = plan_options(
        opts, shape=shape, world=world, local_world=local_world, kernels=kernels, capacity=capacity
    )
    at_micro = {**common, "micro_batch": micro, "accum": accum, "float8": float8}
    return auto_reshard_after_forward(capacity, at_micro)


class _Trainer:
    """One rank's model, optimizer, data and counters."""

    def __init__(
        self,
        opts: TrainOptions,
        data: str | None,
        place: tuple[int, int, torch.device] | None = None,
        eval_data: str | None = None,
    ) -> None:
        """`place` (rank, world size, device) is Ray Train's unless given (tests run one rank in a
        plain process group)."""
        self.opts = opts
        if place is None:
            import ray.train
            import ray.train.torch

            ctx = ray.train.get_context()
            place = (ctx.get_world_rank(), ctx.get_world_size(), ray.train.torch.get_device())
        self.rank, self.world, self.device = place
        self.on_gpu = self.device.type == "cuda"
        if self.on_gpu:
            torch.cuda.set_device(self.device)
        self.backend = dist.get_backend()
        if opts.emulate_hosts:  # divides the workers: checked by the driver
            # NCCL reads it when it builds its first communicator, which is the gather below.
            os.environ["NCCL_HOSTID"] = emulated_host_id(self.rank, self.world, opts.emulate_hosts)
        # Nodes as NCCL sees them (its host id or the host name; a pod has its own): they decide
        # what crosses the network, so they decide the HSDP mesh and the transport gate.
        keys: list[Any] = [None] * self.world
        dist.all_gather_object(keys, host_key(os.environ))
        self.nodes, local_world = host_layout([str(k) for k in keys])
        if local_world is None and opts.sharding == "hsdp":
            raise ValueError(f"--sharding hsdp needs the same number of contiguous ranks per host: {keys}")

        model = self._build_model(local_world or self.world)
        mcfg: Any = model.config
        gpu_name = torch.cuda.get_device_name(self.device) if self.on_gpu else "cpu"
        self.device_name = gpu_name
        self.peak = opts.peak_tflops or (peak_tflops(gpu_name) if self.on_gpu else None)
        mesh = make_mesh(self.device.type, opts.sharding, self.world, local_world or self.world)
        self.mesh_shape = tuple(mesh.shape)
        self.model: Any = apply_fsdp(
            model,
            mesh,
            compile_layers=self.compile,
            activation_checkpointing=opts.activation_checkpointing,
            reshard_after_forward=self.reshard_after_forward,
        )
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],  # LoRA: the adapters alone
            lr=opts.lr,
            betas=(0.9, 0.95),
            weight_decay=opts.weight_decay,
            fused=True if self.on_gpu else None,
        )
        micro = self.micro
        self.global_batch = opts.global_batch_size or micro * self.world
        self.accum = self.global_batch // (micro * self.world)
        # Prepared shards, read by position: memory-mapped or ranged reads, never the whole corpus.
        self.blocks = TokenBlocks(data) if data is not None else None
        self.data_fingerprint = self.blocks.fingerprint if self.blocks is not None else None
        train_blocks, self.eval_blocks = self._split_eval(eval_data)
        self.stopped_early = False
        self.vocab_size = int(mcfg.vocab_size)
        self.batches = Batches(
            train_blocks,
            seq_len=opts.seq_len,
            vocab=mcfg.vocab_size,
            seed=opts.seed,
            micro=micro,
            accum=self.accum,
            world=self.world,
            rank=self.rank,
            prefetch=True,
            pin=self.on_gpu,
        )
        # Liger's loss in chunks of --loss-chunk-tokens (training/loss_chunks.py), passed through the
        # model's forward kwargs, which Liger's patched forward hands to its loss.
        self.loss_chunk_tokens = (
            opts.loss_chunk_tokens
            if opts.loss_chunk_tokens is not None
            else default_chunk_tokens(_gpu_memory_gib(self.device))
        )
        self.loss_kwargs = (
            {"chunk_mem_const": chunk_mem_const(
                micro * opts.seq_len, mcfg.vocab_size, mcfg.hidden_size, self.loss_chunk_tokens
            )}
            if self.liger
            else {}
        )  # fmt: skip
        self.skip_guards, self.steps_here = self._skip_guards(), 0
        self.step, self.position = 0, 0
        self.history: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self.transport: dict[str, Any] = {}
        self.timer = StepTimer(self.device)
        torch.manual_seed(opts.seed * 1000 + self.rank)

    def _build_model(self, local_world: int) -> Any:
        """The rank's model with its kernels chosen (and LoRA's adapters), not yet sharded; sets
        the parameter count and the FLOPs per token MFU is counted with."""
        opts = self.opts
        # LoRA's base is frozen in bf16 from the start (no fp32 copy on the host either).
        dtype = torch.bfloat16 if opts.lora is not None else torch.float32
        model = build_model(opts.init, opts.shape, opts.model, opts.seed, dtype=dtype)
        self._choose_kernels(model, local_world or self.world)
        self.n_params = count_params(model)
        mcfg: Any = model.config
        # Attention's FLOPs are 12 L (heads x head_dim) T: head_dim x heads != hidden for Qwen3, Gemma.
        self.flops_tok = flops_per_token(
            self.n_params, mcfg.num_hidden_layers, Dims.from_config(mcfg.to_dict()).q_dim, opts.seq_len
        )
        if opts.lora is not None:  # after Liger's patches, which replace modules by class
            apply_lora(model, opts.lora, base_model=opts.model)
            self.flops_tok = lora_flops_per_token(Dims.from_config(mcfg.to_dict()), opts.lora, opts.seq_len)
        return model

    def _skip_guards(self) -> bool:
        """--skip-guard-eval: only with compiled layers, and by default only where every
        micro-batch has one shape and no attention mask (text or random data, not chat blocks)."""
        flagged = self.blocks is not None and self.blocks.has_flags
        chosen = self.opts.skip_guard_eval
        return self.compile and (not flagged if chosen is None else chosen)

    def _split_eval(self, eval_data: str | None) -> tuple[Any, Any]:
        """(training blocks, held-out blocks): --eval-fraction holds out the last blocks of the
        training data (never trained on); --eval-data is a prepared set of its own."""
        if self.opts.eval_fraction and self.blocks is not None:
            split = held_out_split(len(self.blocks), self.opts.eval_fraction)
            return BlockRange(self.blocks, 0, split), BlockRange(self.blocks, split, len(self.blocks))
        return self.blocks, TokenBlocks(eval_data) if eval_data is not None else None

    def _choose_kernels(self, model: Any, local_world: int) -> None:
        """Compile, Liger, the micro-batch and float8, applied to the model before fully_shard."""
        opts = self.opts
        # Unset (None) means the fastest measured GPU settings (BENCHMARKS.md) on GPU workers, and
        # plain eager PyTorch on CPU, where neither pays off.
        self.compile = self.on_gpu if opts.compile is None else opts.compile
        self.liger = (self.on_gpu and _liger_installed()) if opts.liger is None else opts.liger
        self.liger_layers = self.liger and (
            not self.compile if opts.liger_layers is None else opts.liger_layers
        )
        if self.liger:
            apply_liger(model, layers=self.liger_layers)
        capability = torch.cuda.get_device_capability(self.device) if self.on_gpu else None

        def float8_at(micro: int) -> bool:
            if opts.lora is not None:  # a frozen bf16 base: float8 is refused with LoRA (options.py)
                return False
            if opts.float8 is not None:
                return opts.float8
            return float8_by_default(
                capability, compiled=self.compile, torchao=_torchao_installed(), tokens=micro * opts.seq_len
            )

        dims = Dims.from_config(model.config.to_dict())
        self.micro = opts.micro_batch_size or self._auto_micro_batch(dims, local_world, float8_at)
        self.float8 = float8_at(self.micro)
        self.float8_layers: list[str] = []
        if self.float8:
            check_float8_device(capability, torch.cuda.get_device_name(self.device) if self.on_gpu else "cpu")
            self.float8_layers = apply_float8(model, all_gather=opts.float8_all_gather)
            # By default, a model with no linear large enough (--shape tiny/small) trains in bf16
            # and says so, rather than reporting float8 with nothing converted.
            self.float8 = bool(self.float8_layers) or opts.float8 is not None
        self.reshard_after_forward = self._reshard_after_forward(dims, local_world)

    def _reshard_after_forward(self, dims: Dims, local_world: int) -> bool:
        """--reshard-after-forward as given, or by the memory plan at the chosen micro-batch
        (training/memory_plan.py auto_reshard_after_forward); alike on every rank."""
        opts = self.opts
        if opts.reshard_after_forward is not None:
            return opts.reshard_after_forward
        if not self.on_gpu:
            return True  # the host's memory is not planned
        per_step = opts.global_batch_size or self.micro * self.world
        mine = planned_reshard(
            opts,
            shape=dims,
            world=self.world,
            local_world=local_world,
            kernels=(self.compile, self.liger, self.liger_layers),
            capacity=torch.cuda.get_device_properties(self.device).total_memory,
            micro=self.micro,
            accum=per_step // (self.micro * self.world),
            float8=self.float8,
        )
        # A rank that reshards gathers again in its backward: a collective the others would never
        # start. Keep the parameters gathered only where every rank's plan allows it.
        chosen: list[Any] = [None] * self.world
        dist.all_gather_object(chosen, mine)
        reshard = any(bool(c) for c in chosen)
        if self.rank == 0:
            kept = "freed after each layer's forward" if reshard else "kept gathered through the step"
            _say(f"[train] --reshard-after-forward by the memory plan: parameters {kept}")
        return reshard

    def _auto_micro_batch(self, dims: Dims, local_world: int, float8_at: Callable[[int], bool]) -> int:
        """--micro-batch-size auto: the memory plan's choice for this GPU (training/memory_plan.py),
        the same on every rank (the smallest, should the ranks' GPUs differ: a different
        accumulation would leave one rank waiting in a collective the others never start)."""
        opts = self.opts
        assert opts.global_batch_size is not None  # auto needs it: checked by parse_args
        per_rank = opts.global_batch_size // self.world  # a multiple: checked by the driver
        if not self.on_gpu:
            if self.rank == 0:  # the host's memory is not planned: one pass per step
                _say(f"[train] --micro-batch-size auto: {per_rank} x 1 per step on each CPU worker")
            return per_rank
        capacity = torch.cuda.get_device_properties(self.device).total_memory
        mine = planned_micro_batch(
            opts,
            shape=dims,
            world=self.world,
            local_world=local_world,
            kernels=(self.compile, self.liger, self.liger_layers),
            capacity=capacity,
            float8_at=float8_at,
        )
        chosen: list[Any] = [None] * self.world
        dist.all_gather_object(chosen, mine)
        micro = min(int(c) for c in chosen)
        if self.rank == 0:
            _say(f"[train] --micro-batch-size auto: {micro} x {per_rank // micro} per step on each worker")
        return micro

    def resume(self, ckpt_dir: str, filesystem: Any = None) -> None:
        meta = checkpoint.load(ckpt_dir, self.model, self.optimizer, filesystem=filesystem)
        self.step, self.position = meta["step"], meta["position"]
        saved = meta.get("data_fingerprint")
        if self.rank == 0 and saved != self.data_fingerprint:
            _say(f"[train] warning: resuming on other data (fingerprint {saved} -> {self.data_fingerprint})")
        self.history = [h for h in meta.get("history", []) if h["step"] <= self.step]
        self.resumes = [
            *meta.get("resumes", []),
            {
                "from_step": self.step,
                "world_size": self.world,
                "rng_restored": meta["rng_restored"],
                # What this rank read of the checkpoint (rank 0's record is the one kept).
                "read_bytes": meta["read"]["bytes"],
                "read_files": meta["read"]["files"],
            },
        ]
        if self.rank == 0:
            _say(f"[train] resumed from step {self.step} (data position {self.position})")

    def accumulate_gradients(self) -> tuple[torch.Tensor, float, int | torch.Tensor]:
        """Forward and backward over this rank's micro-batches of the step at self.position.

        Every micro-batch's loss is its sum over target tokens divided by the step's target count
        over all ranks and micro-batches, divided by the world size (training/loss.py): with
        FSDP2's average over ranks, the step's gradient is that of the mean over the global batch.
        Returns (this rank's share of the step's loss, on the device; data wait in seconds; the
        step's target tokens over all ranks)."""
        tw = time.perf_counter()
        # The whole step's micro-batches first (prefetched during the last step): the divisor
        # must be known before the first backward.
        parts = [self.batches.micro_batch_parts(self.position, mb) for mb in range(self.accum)]
        data_wait = time.perf_counter() - tw
        inputs = [(ids, *labels_and_positions(ids, flags)) for ids, flags in parts]
        local = sum(count_targets(labels) for _, labels, _ in inputs)
        targets: int | torch.Tensor
        divisor: float | torch.Tensor
        if self.blocks is not None and self.blocks.has_flags:
            targets = torch.tensor(float(local), device=self.device)
            dist.all_reduce(targets)  # one scalar per step; queued, no host wait
            divisor = targets.clamp(min=1.0) / self.world
        else:  # every token of every block is a target: the count is known
            targets = self.global_batch * (self.opts.seq_len - 1)
            divisor = targets / self.world
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        warm = self.skip_guards and self.steps_here >= SKIP_GUARDS_AFTER
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=warm):
            self._micro_batches(inputs, divisor, loss_sum)
        return loss_sum, data_wait, targets

    def _micro_batches(
        self, inputs: list[Any], divisor: float | torch.Tensor, loss_sum: torch.Tensor
    ) -> None:
        """Forward and backward of each micro-batch; the losses are added into `loss_sum`."""
        model = self.model
        on = self.device
        for mb, (ids_h, labels_h, pos_h) in enumerate(inputs):
            ids, labels = ids_h.to(on, non_blocking=True), labels_h.to(on, non_blocking=True)
            positions = pos_h.to(on, non_blocking=True) if pos_h is not None else None
            # Reduce-scatter gradients only after the step's last micro-batch.
            model.set_requires_gradient_sync(mb == self.accum - 1)
            if not self.reshard_after_forward:
                # Keep the gathered parameters from one micro-batch to the next (FSDP2's
                # set_reshard_after_backward): one all-gather per layer per step.
                model.set_reshard_after_backward(mb == self.accum - 1)
            loss = model(
                input_ids=ids,
                labels=labels,
                position_ids=positions,
                use_cache=False,
                num_items_in_batch=divisor,
                **self.loss_kwargs,
            ).loss
            loss.backward()
            loss_sum += loss.detach().float()

    def run_eval(self) -> dict[str, Any]:
        """Collective: the held-out figures, the same on every rank (training/evaluate.py)."""
        t0 = time.perf_counter()
        out: dict[str, Any] = evaluate(
            self.model,
            self.eval_blocks,
            rank=self.rank,
            world=self.world,
            micro=self.micro,
            device=self.device,
        )
        out["eval_time_s"] = time.perf_counter() - t0
        return out

    def train_step(self) -> dict[str, Any]:
        opts, model = self.opts, self.model
        self.timer.start()
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.step, opts)
        loss_sum, data_wait, targets = self.accumulate_gradients()
        grad_norm = None
        if opts.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), opts.grad_clip)
            grad_norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.float8 and opts.float8_all_gather:
            precompute_float8_scales(model)
        dist.all_reduce(loss_sum)
        # The step ends when the host has seen the GPU finish it, the all-reduce included: NCCL
        # returns to the host as soon as the collective is queued (training/timing.py).
        dt, end = self.timer.stop()
        self.steps_here += 1
        self.step += 1
        self.position += self.global_batch
        self._note_data_epochs(self.position - self.global_batch, self.position)
        tps = self.global_batch * opts.seq_len / dt
        metrics: dict[str, Any] = {
            "step": self.step,
            "loss": loss_sum.item() / self.world,
            "target_tokens": int(targets),
            "tokens_per_s": tps,
            "step_time_s": dt,
            "end_s": end,
            "data_wait_s": data_wait,
            "peak_mem_gib": _peak_mem_gib(self.device),
            "lr": lr_at(self.step - 1, opts),
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
        }
        util = mfu(tps, self.flops_tok, self.world, self.peak) if self.on_gpu else None
        if util is not None:
            metrics["mfu"] = util
        self.history.append(metrics)
        return metrics

    def _note_data_epochs(self, first: int, end: int) -> None:
        """Log (rank 0) when this step's sequences [first, end) start another pass over the data."""
        if self.blocks is None or self.rank != 0 or not len(self.blocks):
            return
        n = len(self.blocks)
        for epoch in range(first // n + 1, (end - 1) // n + 1):
            _say(
                f"[train] step {self.step}: data epoch {epoch + 1} begins: all {n} sequences of the "
                f"prepared data were read, the run repeats them (reshuffled)"
            )

    def save_and_report(self, metrics: dict[str, Any]) -> None:
        import ray.train

        tmp = tempfile.mkdtemp(prefix="raytrain-ckpt-")
        try:
            checkpoint.save(
                tmp,
                self.model,
                self.optimizer,
                step=self.step,
                position=self.position,
                extra=self.checkpoint_extra(),
            )
            ray.train.report(scored(metrics), checkpoint=ray.train.Checkpoint.from_directory(tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def checkpoint_extra(self) -> dict[str, Any]:
        """What train_state.json holds beside step and position (training/checkpoint.py)."""
        return {
            "history": self.history,
            "resumes": self.resumes,
            "transport": self.transport,
            "n_params": self.n_params,
            "flops_per_token": self.flops_tok,
            "peak_tflops": self.peak,
            "device": self.device_name,
            "backend": self.backend,
            "nodes": self.nodes,
            "global_batch_size": self.global_batch,
            "micro_batch_size": self.micro,
            "accum_steps": self.accum,
            "compile": self.compile,
            "liger": self.liger,
            "liger_layers": self.liger_layers,
            "skip_guard_eval": self.skip_guards,
            "loss_chunk_tokens": self.loss_chunk_tokens,
            "float8": self.float8,
            "float8_layers": len(self.float8_layers),
            "reshard_after_forward": self.reshard_after_forward,
            "mesh": list(self.mesh_shape),
            "data_fingerprint": self.data_fingerprint,
            # What the export needs to write config.json and the tokenizer (training/export.py).
            "model_ref": {
                "init": self.opts.init,
                "shape": self.opts.shape,
                "model": self.opts.model,
                "lora": dataclasses.asdict(self.opts.lora) if self.opts.lora is not None else None,
            },
            "stopped_early": self.stopped_early,
            # For the plot: random ids have a chance-level loss of ln(vocab); shards may repeat.
            "vocab_size": self.vocab_size,
            "data_sequences": len(self.blocks) if self.blocks is not None else None,
        }


def _report(tr: _Trainer, metrics: dict[str, Any], first: bool) -> None:
    """A checkpoint at every --checkpoint-every, the end and an early stop; else metrics only.
    Every rank takes the same branch: ray.train.report is a barrier."""
    import ray.train

    opts = tr.opts
    if tr.stopped_early or tr.step % opts.checkpoint_every == 0 or tr.step == opts.steps:
        tr.save_and_report(metrics)
    elif first or tr.step % opts.report_every == 0:
        ray.train.report(metrics)


def _eval_into(tr: _Trainer, early: EarlyStop, metrics: dict[str, Any]) -> None:
    """Evaluate (every rank: the same figures, so the same early-stop decision) into the step's
    metrics and history."""
    figures = tr.run_eval()
    metrics.update(figures)
    tr.history[-1].update(figures)
    tr.stopped_early = early.observe(figures["eval_loss"])
    if tr.stopped_early and tr.rank == 0:
        _say(
            f"[train] early stop at step {tr.step}: no lower eval loss in "
            f"{early.patience} evaluations (best {early.best:.4f})"
        )


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: build, resume, gate the transport, train, checkpoint."""
    import ray
    import ray.train

    opts = TrainOptions.from_dict(config["options"])
    tr = _Trainer(opts, config.get("data"), eval_data=config.get("eval_data"))
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        # Straight from the storage (S3 on the cluster): each rank reads the byte ranges of the
        # shards its load plan names, not a local copy of the whole checkpoint (as_directory()).
        tr.resume(ckpt.path, filesystem=ckpt.filesystem)

    # Every rank, after the process group is up and before the first step: fail before training
    # when inter-node traffic is not on the expected transport.
    expect = resolve_expect(opts.expect_transport, tr.backend, tr.nodes, os.environ)
    try:
        tr.transport = dict(run_transport_gate(expect, log_dir=None))
    except TransportGateError as exc:
        verdict = config.get("gate_verdict")
        if verdict is None:
            raise
        # The gate judges every rank's facts together, so all ranks land here. Returning (not
        # raising) ends the run without the FailureConfig retries: restarting the same workers
        # on the same network cannot change the verdict. The driver reads it and exits non-zero.
        if tr.rank == 0:
            ray.get(verdict.set.remote(str(exc), dict(exc.result)))
        return
    tr.transport.setdefault("expect", expect)

    profiler = StepProfiler(opts.profile, opts.output_dir, tr.rank, tr.on_gpu)
    # Python's automatic collector runs when allocation counts say so, on each rank at its own
    # moment; a full pass over this process's large heap (compiled graphs, Ray, transformers) stalls
    # that rank's step and, through the collectives, every other rank's. Collect at fixed steps
    # instead, the same on all ranks (as torchtitan does).
    gc.disable()
    gc.collect()
    early = EarlyStop(opts.early_stop_patience, tr.history)
    eval_every = opts.eval_every or opts.checkpoint_every
    try:
        first = True
        while tr.step < opts.steps:
            profiler.before_step(tr.step + 1)
            if tr.step and tr.step % GC_EVERY == 0:
                gc.collect(1)
            metrics = tr.train_step()
            if tr.eval_blocks is not None and (tr.step % eval_every == 0 or tr.step == opts.steps):
                _eval_into(tr, early, metrics)
            emf.publish(opts, tr.rank, metrics)
            for written in profiler.after_step(tr.step):
                _say(f"[train] profile: wrote {written}")
            if first:
                metrics = {**metrics, "transport": tr.transport}
            if tr.rank == 0 and (tr.step % opts.log_every == 0 or tr.step == opts.steps):
                _say(progress.line(metrics, opts.steps, tr.history[-tr.steps_here :]))
            _report(tr, metrics, first)
            first = False
            if tr.stopped_early:
                break
    finally:
        gc.enable()
        tr.batches.close()

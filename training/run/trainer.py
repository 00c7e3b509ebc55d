"""One rank's trainer built: the process group's hosts, the model with its kernels chosen (compile,
Liger, float8, LoRA), the micro-batch and resharding by the memory plan, FSDP2, the optimizer and
the data; the memory plan's arguments for these options, which settings check jobs with too."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any, TypedDict, Unpack

import torch
import torch.distributed as dist

from training.checkpoint.reporter import Reporting
from training.data.batches import Batches, BlockRange
from training.data.shards import TokenBlocks
from training.methods.evaluate import held_out_split
from training.methods.sft import load_chat_tokenizer
from training.model.build import (
    apply_float8,
    apply_fsdp,
    apply_liger,
    build_model,
    check_float8_device,
    host_layout,
    liger_patch,
    make_mesh,
)
from training.model.lora import apply_lora, check_end_of_turn_trained
from training.model.precision import float8_by_default
from training.model.sharding import mesh_shape
from training.network.probe import host_key
from training.options.train import TrainOptions
from training.reporting.progress import say
from training.reporting.timing import StepTimer
from training.run.optimizer import build_optimizer
from training.run.step import Step
from training.sizing.flops import count_params, flops_per_token, lora_flops_per_token, peak_tflops
from training.sizing.loss_chunks import chunk_mem_const, default_chunk_tokens
from training.sizing.memory_plan import Dims, auto_micro_batch, auto_reshard_after_forward


def _liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def _torchao_installed() -> bool:
    return importlib.util.find_spec("torchao") is not None


def _gpu_memory_gib(device: torch.device) -> float:
    """The device's memory (0 on the CPU, where Liger does not run)."""
    if device.type != "cuda":
        return 0.0
    return torch.cuda.get_device_properties(device).total_memory / 2**30


def emulated_host_id(rank: int, world: int, hosts: int) -> str:
    """--emulate-hosts: contiguous blocks of ranks share an id, like ranks on one real node."""
    return f"emulated-host-{rank * hosts // world}"


class PlanPlace(TypedDict):
    """Where the memory plan is made: the model's shape, the ranks, the layers' kernels, the GPU
    (the keyword arguments plan_options, planned_micro_batch and planned_reshard share)."""

    shape: str | Dims
    world: int
    local_world: int
    kernels: tuple[bool, bool, bool]
    capacity: int


def plan_options(opts: TrainOptions, **place: Unpack[PlanPlace]) -> dict[str, Any]:
    """The memory plan's arguments (training/sizing/memory_plan.py `plan`) but the micro-batch, its
    accumulation and float8, for these options, the model's `shape` (a built model's, which a
    pretrained --model decides), `world` ranks of `local_world` per node, the layers as the rank
    built them (compiled, Liger loss, Liger layers) and a GPU of `capacity` bytes. Parameters are
    planned resharded after forward unless kept by --no-reshard-after-forward: the micro-batch is
    chosen first."""
    compiled, liger, liger_layers = place["kernels"]
    world = place["world"]
    mesh = mesh_shape(opts.sharding, world, place["local_world"])
    chunk = opts.loss_chunk_tokens
    if chunk is None:
        chunk = default_chunk_tokens(place["capacity"] / 2**30)
    return dict(
        shape=place["shape"],
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
    opts: TrainOptions, *, float8_at: Callable[[int], bool], **place: Unpack[PlanPlace]
) -> int:
    """--micro-batch-size auto on a GPU of `capacity` bytes: the memory plan's choice
    (training/sizing/memory_plan.py auto_micro_batch); the other arguments as `plan_options`."""
    assert opts.global_batch_size is not None
    common = plan_options(opts, **place)
    per_rank = opts.global_batch_size // place["world"]
    return auto_micro_batch(per_rank, place["capacity"], lambda m: {**common, "float8": float8_at(m)})


def planned_reshard(
    opts: TrainOptions, *, micro: int, accum: int, float8: bool, **place: Unpack[PlanPlace]
) -> bool:
    """--reshard-after-forward's default on a GPU of `capacity` bytes at the chosen micro-batch
    (training/sizing/memory_plan.py auto_reshard_after_forward); the other arguments as `plan_options`."""
    common = plan_options(opts, **place)
    at_micro = {**common, "micro_batch": micro, "accum": accum, "float8": float8}
    return auto_reshard_after_forward(place["capacity"], at_micro)


class Trainer(Step, Reporting):
    """One rank's model, optimizer, data and counters: built here; its step in training/run/step.py,
    its checkpoints, reports and evaluations in training/checkpoint/reporter.py."""

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
        self.optimizer = build_optimizer(
            self.model, lr=opts.lr, weight_decay=opts.weight_decay, fused=self.on_gpu
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
        # Liger's loss in chunks of --loss-chunk-tokens (training/sizing/loss_chunks.py), passed through the
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
        self.preemptions: list[dict[str, Any]] = []
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
            if opts.init == "pretrained" and opts.data_format == "chat":
                check_end_of_turn_trained(model, load_chat_tokenizer(opts.model), opts.model)
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
        model_type = str(getattr(model.config, "model_type", ""))
        if self.liger and opts.liger is None and liger_patch(model_type) is None:
            # By default only: an explicit --liger for such a model is refused before Ray starts.
            self.liger = False
            if self.rank == 0:
                say(f"[train] Liger has no patch for {model_type!r}: transformers' loss and layers")
        self.liger_layers = self.liger and (
            not self.compile if opts.liger_layers is None else opts.liger_layers
        )
        if self.liger:
            apply_liger(model, layers=self.liger_layers)
        capability = torch.cuda.get_device_capability(self.device) if self.on_gpu else None

        def float8_at(micro: int) -> bool:
            if opts.lora is not None:  # a frozen bf16 base: float8 is refused with LoRA (options_model.py)
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

    def _plan_place(self, dims: Dims, local_world: int) -> PlanPlace:
        """This rank's model, layers and GPU, for the memory plan."""
        return PlanPlace(
            shape=dims,
            world=self.world,
            local_world=local_world,
            kernels=(self.compile, self.liger, self.liger_layers),
            capacity=torch.cuda.get_device_properties(self.device).total_memory,
        )

    def _reshard_after_forward(self, dims: Dims, local_world: int) -> bool:
        """--reshard-after-forward as given, or by the memory plan at the chosen micro-batch
        (training/sizing/memory_plan.py auto_reshard_after_forward); alike on every rank."""
        opts = self.opts
        if opts.reshard_after_forward is not None:
            return opts.reshard_after_forward
        if not self.on_gpu:
            return True  # the host's memory is not planned
        per_step = opts.global_batch_size or self.micro * self.world
        mine = planned_reshard(
            opts,
            **self._plan_place(dims, local_world),
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
            say(f"[train] --reshard-after-forward by the memory plan: parameters {kept}")
        return reshard

    def _auto_micro_batch(self, dims: Dims, local_world: int, float8_at: Callable[[int], bool]) -> int:
        """--micro-batch-size auto: the memory plan's choice for this GPU (training/sizing/memory_plan.py),
        the same on every rank (the smallest, should the ranks' GPUs differ: a different
        accumulation would leave one rank waiting in a collective the others never start)."""
        opts = self.opts
        assert opts.global_batch_size is not None  # auto needs it: checked by parse_args
        per_rank = opts.global_batch_size // self.world  # a multiple: checked by the driver
        if not self.on_gpu:
            if self.rank == 0:  # the host's memory is not planned: one pass per step
                say(f"[train] --micro-batch-size auto: {per_rank} x 1 per step on each CPU worker")
            return per_rank
        mine = planned_micro_batch(opts, **self._plan_place(dims, local_world), float8_at=float8_at)
        chosen: list[Any] = [None] * self.world
        dist.all_gather_object(chosen, mine)
        micro = min(int(c) for c in chosen)
        if self.rank == 0:
            say(f"[train] --micro-batch-size auto: {micro} x {per_rank // micro} per step on each worker")
        return micro

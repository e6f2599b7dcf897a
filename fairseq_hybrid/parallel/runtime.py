"""``HybridRuntime``: one model's parallel life cycle, in one place. It holds the typed
placement options (``placement.Placement``: parsed and checked above this layer), turns
them into a plan, places the model's layers (and keeps them placed through ``model.to()``),
starts the device workers, resolves ``AUTO`` chunks with the chooser it was given (the
performance model's, wired in by ``plugin/``: this layer does not import it) and then
builds the engine with an integer chunk count.

Nothing starts before the first training step: building a model for generation or a
checkpoint conversion never starts a thread. Copies of the model (``copy.deepcopy`` for
fairseq's --ema, pickling) get a runtime of their own with the same options and no
threads; it starts its own when it trains.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Protocol, Tuple

from torch import Tensor

from ..model.encoder import EncoderOut
from ..model.loss import HeadLoss, TokenLoss
from .engine import HybridEngine
from .interface import HybridModel
from .placement import Placement, PlacementPlan, devices_of, place, plan_for, resolved_chunks
from .worker import DeviceWorkers

logger = logging.getLogger(__name__)


class ChunkDecision(Protocol):
    """What the runtime needs of a chunk chooser's answer: the chosen K and the lines that
    explain it (``chunking.chunk_choice.ChunkChoice``, with its predictions, is one)."""

    chunks: int

    def lines(self) -> List[str]: ...


# (model, plan with 1 chunk, its workers, src_tokens, src_lengths, prev_output_tokens)
ChunkChooser = Callable[[HybridModel, PlacementPlan, DeviceWorkers, Tensor, Tensor, Tensor],
                        ChunkDecision]


class HybridRuntime:
    def __init__(self, model: HybridModel, options: Placement,
                 choose_chunks: Optional[ChunkChooser] = None,
                 cpu_threads: Optional[int] = None) -> None:
        """``choose_chunks`` resolves ``AUTO`` chunks on several devices (None:
        2 chunks per device); ``cpu_threads``: torch threads per CPU device worker
        (default: the cores split between them)."""
        self.model = model
        self.options = options
        self.choose_chunks = choose_chunks
        self.cpu_threads = cpu_threads
        self.choice: Optional[ChunkDecision] = None
        self._placed: Optional[PlacementPlan] = None
        self._engine: Optional[HybridEngine] = None
        self._retired: List[HybridEngine] = []  # built by build_engine, closed by close()

    # ------------------------------------------------------------------ plan
    def plan(self, chunks: Optional[int] = None) -> PlacementPlan:
        """The plan of the current options with ``chunks`` time chunks (default: the
        options' count; ``AUTO`` on several devices is the engine's to choose, so it needs
        ``chunks`` here)."""
        chunks = resolved_chunks(self.options) if chunks is None else chunks
        if chunks is None:
            raise ValueError("the chunk count is chosen when the engine is built: give chunks")
        return self._plan_of(self.options, chunks)

    def place(self, plan: PlacementPlan) -> None:
        """Put the model's layers where ``plan`` says, and keep them there."""
        self._placed = plan
        place(self.model, plan)

    def restore_placement(self) -> None:
        """After ``model.to()``/``.half()``: back to the placed devices (if placed)."""
        if self._placed is not None:
            place(self.model, self._placed)

    # ---------------------------------------------------------------- engine
    @property
    def engine(self) -> HybridEngine:
        """The training engine, built (and the model placed) on first use."""
        if self._engine is None:
            self._engine = self._build(None)
        return self._engine

    def features(self, src_tokens: Tensor, src_lengths: Tensor,
                 prev_output_tokens: Tensor) -> Tuple[Tensor, EncoderOut]:
        """The model-parallel part of a training step (the model's ``forward(hybrid=True)``);
        the first call resolves ``AUTO`` chunks on this batch."""
        if self._engine is None:
            self._engine = self._build((src_tokens, src_lengths, prev_output_tokens))
        return self._engine.features(src_tokens, src_lengths, prev_output_tokens)

    def head_loss(self, features: Tensor, encoder_out: EncoderOut, target: Tensor,
                  loss_fn: TokenLoss) -> HeadLoss:
        return self.engine.head_loss(features, encoder_out, target, loss_fn)

    def _build(self, batch: Optional[Tuple[Tensor, Tensor, Tensor]]) -> HybridEngine:
        chunks = resolved_chunks(self.options)
        plan = self._plan_of(self.options, 1 if chunks is None else chunks)  # the chooser measures with 1
        workers = DeviceWorkers(plan.devices, self.cpu_threads)
        self.place(plan)
        note = ""
        if chunks is None:
            if self.choose_chunks is None or batch is None:
                plan = replace(plan, chunks=2 * plan.num_devices)
                note = " (auto: 2 per device, no batch measured)"
            else:
                src_tokens, src_lengths, prev = batch
                master = plan.master
                self.choice = self.choose_chunks(self.model, plan, workers, src_tokens.to(master),
                                                 src_lengths, prev.to(master))
                plan = replace(plan, chunks=self.choice.chunks)
                note = " (auto)"
        lines = [plan.table(note)]
        if self.choice is not None:
            lines += ["  " + line for line in self.choice.lines()]
        if any(d.type == "cpu" for d in plan.devices) and plan.num_devices > 1:
            lines.append(f"  {workers.cpu_threads} torch thread(s) per CPU device worker")
        logger.info("\n" + "\n".join(lines))
        return HybridEngine(self.model, plan, workers)

    def configure(self, options: Optional[Placement] = None, cpu_threads: Optional[int] = None,
                  **changes: object) -> None:
        """Train on other placement options from now on: ``options``, or the current ones,
        with ``changes`` (typed values of its fields: devices, balance, chunks, split_head);
        the current engine's workers are closed and the next training step builds a new
        engine (and resolves ``AUTO`` chunks on its batch)."""
        self.close()
        self.options = self._changed(options, changes)
        self.cpu_threads = cpu_threads or self.cpu_threads
        self.choice = None

    def build_engine(self, options: Optional[Placement] = None, **changes: object) -> HybridEngine:
        """Another engine for ``options`` (or the current ones) updated by ``changes``, kept
        beside the current one (a benchmark keeps several placements warm); ``use_engine``
        switches. ``AUTO`` chunks plan 2 per device here: nothing is measured."""
        options = self._changed(options, changes)
        chunks = resolved_chunks(options)
        plan = self._plan_of(options, 2 * len(devices_of(options.devices)) if chunks is None else chunks)
        engine = HybridEngine(self.model, plan, DeviceWorkers(plan.devices, self.cpu_threads))
        self._retired.append(engine)
        return engine

    def _changed(self, options: Optional[Placement], changes: Dict[str, object]) -> Placement:
        """``options`` (default: the current ones) with the typed ``changes``."""
        return replace(self.options if options is None else options, **changes)

    def _plan_of(self, options: Placement, chunks: int) -> PlacementPlan:
        encoder, decoder = self.model.encoder, self.model.decoder
        return plan_for(options, encoder.num_layers, decoder.num_layers, chunks,
                        head_with_top_layers=not decoder.input_feeding)

    def use_engine(self, engine: HybridEngine) -> None:
        """Train through ``engine`` (from ``build_engine``) from now on, the model placed
        for it."""
        self.place(engine.plan)
        if self._engine is not None and self._engine not in self._retired:
            self._retired.append(self._engine)
        self._engine = engine

    def close(self) -> None:
        """Stop every engine's worker threads (a new engine is built on next use)."""
        for engine in [self._engine, *self._retired]:
            if engine is not None:
                engine.workers.close()
        self._engine, self._retired = None, []

    def __getstate__(self) -> dict:
        """A copy keeps the options and the placement, not the engine and its threads."""
        state = dict(self.__dict__)
        state.update(_engine=None, _retired=[])
        return state

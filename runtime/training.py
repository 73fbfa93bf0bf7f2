"""A training run around a stepper (the plan interpreter, or the reference executor): data in,
evaluation, checkpoints out and back in, a log, and Ctrl-C that keeps the work done.

One loop for both executors: each step takes the batch the loader prepared while the last step ran,
runs, and is reported; every ``eval_every`` steps and at the end the evaluator runs the forward pass
over the held-out data; every ``save_every`` steps and at the end the state goes to a checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import BinaryIO, Protocol

import attrs
import numpy as np

from swapdsl.common.atomic import check_outputs
from swapdsl.common.checks import as_flag, as_text, as_whole, callable_or_none, flag, one_of, text, whole
from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import Graph
from swapdsl.runtime import checkpoint, dist, nonfinite
from swapdsl.runtime.dataset import Batch, Dataset, Loader, Order, batch_size, fingerprint, gather, open_dataset
from swapdsl.runtime.log import append, check_log, open_log

SYNTHETIC = "synthetic"
DEFAULT_STEPS = 10  # with synthetic data and neither --steps nor --epochs


class Stepper(Protocol):
    """What the loop needs of an executor."""

    def set_batch(self, batch: Mapping[str, np.ndarray]) -> None: ...
    def run_step(self, step: int) -> tuple[float, float]: ...  # (loss, milliseconds)
    def metrics(self) -> dict[str, float]: ...
    def state(self, names: Collection[str] | None = None) -> dict[str, np.ndarray]: ...  # (None: all)
    def load_state(self, values: Mapping[str, np.ndarray], step: int) -> None: ...
    @property
    def steps_run(self) -> int: ...


ON_NONFINITE = ("stop", "skip", "continue")
MAX_SEED = 2**63  # seeds are from 0 to 2^63 - 1


@attrs.frozen
class Options:
    """How to train. ``steps`` and ``epochs`` count from the start of training (a resumed run goes on to
    them); with neither, one epoch of ``data``, or ten steps of synthetic data."""

    steps: int | None = attrs.field(default=None, converter=as_whole, validator=whole(1, optional=True))
    epochs: int | None = attrs.field(default=None, converter=as_whole, validator=whole(1, optional=True))
    # None: 0, or the resumed checkpoint's
    seed: int | None = attrs.field(default=None, converter=as_whole, validator=whole(0, MAX_SEED - 1, optional=True))
    data: str = attrs.field(default=SYNTHETIC, converter=as_text, validator=text())
    shuffle: bool = attrs.field(default=False, converter=as_flag, validator=flag)
    eval: str | None = attrs.field(default=None, converter=as_text, validator=text(optional=True))
    eval_every: int = attrs.field(default=0, converter=as_whole, validator=whole(0))
    save: str | None = attrs.field(default=None, converter=as_text, validator=text(optional=True))
    save_every: int = attrs.field(default=0, converter=as_whole, validator=whole(0))
    resume: str | None = attrs.field(default=None, converter=as_text, validator=text(optional=True))
    init: str | None = attrs.field(default=None, converter=as_text, validator=text(optional=True))
    log: str | None = attrs.field(default=None, converter=as_text, validator=text(optional=True))
    # or skip (a guarded plan's skipped steps go on) or continue (train on regardless)
    on_nonfinite: str = attrs.field(default="stop", validator=one_of(ON_NONFINITE))
MIN_LOSS_SCALE = 1.0  # below it the scaler has given up: even unscaled gradients overflow


@attrs.frozen
class StepRecord:
    step: int
    epoch: int | None  # 1, 2, ... with data; None with synthetic data
    loss: float
    metrics: dict[str, float]
    step_ms: float
    examples: int
    h2d_bytes: int  # the plan's copies each way (0 with no plan)
    d2h_bytes: int
    diff: float | None = None  # --check: largest relative difference from the reference
    diff_at: str | None = None  # --check: where it is: "loss", or a persistent tensor's name
    check_ms: float | None = None  # --check: the reference's step and the comparison


@attrs.frozen
class EvalRecord:
    step: int
    loss: float
    metrics: dict[str, float]
    examples: int
    dropped: int  # the held-out data's last partial batch
    eval_ms: float


@attrs.frozen
class SaveRecord:
    step: int
    path: str
    nbytes: int
    write_ms: float


@attrs.frozen
class Hooks:
    """Callbacks a training run makes, each optional: ``on_start`` once the data and checkpoints are
    checked (first step, last step, the data or None for synthetic, the seed); ``on_step`` after every
    step, ``on_eval`` after every evaluation and ``on_save`` after every checkpoint, with its record."""

    # (first step, last step, data, seed)
    on_start: Callable[[int, int, Dataset | None, int], None] | None = attrs.field(default=None,
                                                                                  validator=callable_or_none)
    on_step: Callable[[StepRecord], None] | None = attrs.field(default=None, validator=callable_or_none)
    on_eval: Callable[[EvalRecord], None] | None = attrs.field(default=None, validator=callable_or_none)
    on_save: Callable[[SaveRecord], None] | None = attrs.field(default=None, validator=callable_or_none)


@attrs.frozen
class Outcome:
    steps: list[StepRecord]
    evals: list[EvalRecord]
    saves: list[SaveRecord]
    first_step: int  # 1, or the step after the resumed checkpoint's
    dataset: Dataset | None


class Beside:
    """``exec --check``: the reference executor run beside the stepper on the same batches from the same
    state, compared after every step (``context``: where the reference allocates)."""

    def __init__(self, ref: Stepper, context: Callable[[], contextlib.AbstractContextManager[object]],
                 g: Graph | None = None) -> None:
        self.ref, self.context, self.g = ref, context, g  # ``g``: the training graph (its ranks)

    def load_state(self, values: Mapping[str, np.ndarray], step: int) -> None:
        with self.context():
            self.ref.load_state(values, step)

    def __call__(self, batch: Batch | None, step: int, loss: float, stepper: Stepper) -> tuple[float, str]:
        """The largest relative difference of the loss and every persistent tensor after ``step``, and
        where it is ("loss" or the tensor's name)."""
        with self.context():
            if batch is not None:
                self.ref.set_batch(batch if self.g is None else dist.shard(self.g, batch))
            ref_loss = self.ref.run_step(step)[0]
            if self.g is not None:
                ref_loss = dist.mean(ref_loss, self.g)
            ref_state = self.ref.state()
        diffs = {k: relative_diff(v, ref_state[k]) for k, v in stepper.state().items()}
        diffs["loss"] = relative_diff(loss, ref_loss)
        at = max(diffs, key=lambda k: (diffs[k], k == "loss"))  # a tie (all equal): the loss
        return diffs[at], at


def relative_diff(a: object, b: object) -> float:
    """max |a - b| / max |b| over the finite elements of b (equal elements, NaNs too, differ by 0); infinite
    where a NaN or an infinity is not matched."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not x.size:
        return 0.0
    with np.errstate(invalid="ignore"):
        apart = np.where((x == y) | (np.isnan(x) & np.isnan(y)), 0.0, np.abs(x - y))
    finite = np.abs(y[np.isfinite(y)])
    diff = float(np.max(apart)) / max(float(np.max(finite)) if finite.size else 0.0, 1e-12)
    return math.inf if math.isnan(diff) else diff


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (``signum``) during training, after the current step finished (and was saved
    with --save)."""

    def __init__(self, step: int, saved: str | None, signum: int = signal.SIGINT) -> None:
        super().__init__(step, saved, signum)
        self.step, self.saved, self.signum = step, saved, int(signum)


def resolve(opts: Options) -> Options:
    """``opts`` with its seed settled: the resumed checkpoint's (a different one given is refused), else 0; a
    resumed run's data and order checked against the checkpoint's, and no output over an input."""
    if opts.resume and opts.init:
        raise SwpError("give --resume or --init, not both",
                       hints=["--resume continues a run; --init starts a new one from saved parameters"])
    check_outputs([(opts.save, "checkpoint"), (opts.log, "log")],
                  [(opts.data if opts.data != SYNTHETIC else None, "training data"), (opts.eval, "held-out data"),
                   (opts.init, "initial checkpoint"), (opts.resume, "checkpoint resumed")],
                  may_replace=[("checkpoint", "initial checkpoint"), ("checkpoint", "checkpoint resumed")])
    if opts.log is not None:
        check_log(opts.log)  # (on every rank, before the run: not rank 0's alone once it has begun)
    if not opts.resume:
        return attrs.evolve(opts, seed=opts.seed or 0)
    ck = checkpoint.read(opts.resume, "--resume", tensors=False)
    checkpoint.check_same_data(ck, opts.data, opts.shuffle, SYNTHETIC)
    seed = ck.seed
    if opts.seed is not None and opts.seed != seed:
        raise SwpError(f"--resume `{opts.resume}` was written by a run with --seed {seed}, this one has "
                       f"--seed {opts.seed}", hints=[f"leave --seed out, or give --seed {seed}: the data order "
                                                     "depends on it"])
    return attrs.evolve(opts, seed=seed)


def plan_run(g: Graph, opts: Options) -> tuple[Dataset | None, Order | None, int]:
    """The data (checked against the model), its order, and the last step to run."""
    if opts.steps is not None and opts.epochs is not None:
        raise SwpError("give --steps or --epochs, not both")
    for every, needs in (("eval_every", "eval"), ("save_every", "save")):
        if getattr(opts, every) and not getattr(opts, needs):
            raise SwpError(f"--{every.replace('_', '-')} needs --{needs} PATH")
    ds = None if opts.data == SYNTHETIC else open_dataset(opts.data, g, ranks=g.ranks)
    if ds is None:
        if opts.epochs is not None or opts.shuffle:
            raise SwpError(f"--{'epochs' if opts.epochs is not None else 'shuffle'} needs --data PATH",
                           hints=["synthetic data is one fixed batch, repeated"])
        return None, None, opts.steps or DEFAULT_STEPS
    order = Order(ds.examples, ds.batch, opts.shuffle, opts.seed or 0)
    last = opts.steps if opts.steps is not None else (opts.epochs or 1) * order.per_epoch
    return ds, order, last


def train(g: Graph, stepper: Stepper, opts: Options, hooks: Hooks = Hooks(), evaluate: Evaluator | None = None,
          check: Beside | None = None, moved: tuple[int, int] = (0, 0)) -> Outcome:
    """Run the training ``opts`` (``resolve``d) describes on ``stepper`` (``g``: its training graph;
    ``moved``: the bytes its plan copies in and out each step)."""
    ds, order, last = plan_run(g, opts)
    lead = dist.rank() == 0  # rank 0 speaks for the run: it alone reports, logs and writes checkpoints
    if not lead:  # (every rank still checks the state it would save: a stop must be every rank's)
        hooks, opts = Hooks(), attrs.evolve(opts, log=None)
    if opts.on_nonfinite == "skip" and g.guard == "none":
        raise SwpError("--on-nonfinite skip needs a guarded step: its updates wait for every gradient to be "
                       "finite", hints=["plan (or train) with --guard skip or --guard scale"])
    held_out = open_dataset(opts.eval, g, "--eval", partial=True) if opts.eval else None
    if held_out is not None and evaluate is None:
        raise SwpError("--eval is not available for this executor")
    if held_out is not None and evaluate is not None:
        evaluate.check(held_out)
    data_id = (ds.examples, fingerprint(ds)) if ds is not None and ((opts.save and lead) or opts.resume) else None
    start = _restore(g, stepper, opts, data_id)
    if g.ranks > 1:
        _agree(g, opts, ds, start, last, stepper, check is not None)
    dist.started()
    if check is not None and (opts.resume or opts.init):
        check.load_state(stepper.state(), start)
    if start >= last:
        raise dist.EveryRank(f"--resume `{opts.resume}` is at step {start}; the run ends at step {last}, so there "
                             "is nothing left to do", hints=["ask for more with --steps or --epochs"])
    log = open_log(opts.log) if opts.log is not None else None
    loader = Loader(ds, order, start) if ds is not None and order is not None else None
    examples = ds.batch if ds is not None else _batch_of(g) * g.ranks  # data-parallel: every rank's rows
    steps: list[StepRecord] = []
    evals: list[EvalRecord] = []
    saves: list[SaveRecord] = []

    def save(step: int) -> None:
        if opts.save and (not saves or saves[-1].step != step):
            values = stepper.state()
            if opts.on_nonfinite == "stop" and not nonfinite.all_finite(values.values()):
                raise _nonfinite(g, opts, start, step, f"the state to checkpoint after step {step} is not finite",
                                 ds, order)
            saves.append(_save(g, values, opts, step, data_id) if lead else SaveRecord(step, opts.save, 0, 0.0))
            _emit(hooks.on_save, saves[-1], log, "save")

    def evaluation(step: int) -> None:
        if held_out is not None and evaluate is not None and (not evals or evals[-1].step != step):
            evals.append(evaluate(held_out, step))
            _emit(hooks.on_eval, evals[-1], log, "eval")

    try:
        with deferred_interrupts() as stop:
            if hooks.on_start is not None:
                hooks.on_start(start + 1, last, ds, opts.seed or 0)
            for step in range(start + 1, last + 1):
                batch = None
                if loader is not None:
                    _, batch = loader.next()
                    stepper.set_batch(dist.shard(g, batch))
                dist.at_step(step)
                loss, ms = stepper.run_step(step)
                loss, stopping = dist.step_sync(loss, stop.is_set(), g)
                if not math.isfinite(loss) and opts.on_nonfinite == "stop":
                    raise _nonfinite(g, opts, start, step, f"the loss of step {step} is {loss}", ds, order)
                checked = time.perf_counter()
                diff, diff_at = check(batch, step, loss, stepper) if check is not None else (None, None)
                check_ms = (time.perf_counter() - checked) * 1e3 if check is not None else None
                epoch = order.epoch_of(step - 1) + 1 if order is not None else None
                metrics = stepper.metrics()
                if opts.on_nonfinite == "stop" and _gave_up(g, metrics):
                    raise _nonfinite(g, opts, start, step, _why_skipped(step, metrics), ds, order)
                steps.append(StepRecord(step, epoch, loss, metrics, ms, examples, *moved, diff, diff_at,
                                        check_ms))
                _emit(hooks.on_step, steps[-1], log, "step")
                if opts.save_every and step % opts.save_every == 0:  # (saved first: an evaluation that
                    save(step)                                        # fails loses no training)
                if opts.eval_every and step % opts.eval_every == 0:
                    evaluation(step)
                if stopping or (g.ranks == 1 and stop.is_set()):  # (ranks: only the stop all agreed on)
                    save(step)
                    raise Interrupted(step, saves[-1].path if saves and saves[-1].step == step else None,
                                      stop.signum)
            save(last)
            evaluation(last)
    finally:
        if loader is not None:
            loader.close()
        if log is not None:
            log.close()
    return Outcome(steps, evals, saves, start + 1, ds)


def _agree(g: Graph, opts: Options, ds: Dataset | None, start: int, last: int, stepper: Stepper,
           checked: bool) -> None:
    """Data-parallel ranks start the same run: the same steps, data and state, all checked or none."""
    dist.agree(g, "steps", f"{start + 1} to {last}")
    dist.agree(g, "data", f"{opts.data} ({ds.examples if ds else 0} examples, shuffle {opts.shuffle}, "
                          f"seed {opts.seed or 0})")
    dist.agree(g, "a start", f"from {dist.state_digest(stepper.state())}, {'with' if checked else 'without'} "
                             "--check")
    # (a rank that stops at a non-finite value, or at a state it would save, stops alone otherwise)
    dist.agree(g, "--on-nonfinite", opts.on_nonfinite)
    if opts.on_nonfinite == "stop":
        every = opts.save_every if 0 < opts.save_every < last else 0
        saves = f"every {every} steps and after the last" if every > 1 else "after every step" if every \
            else "after the last step"
        dist.agree(g, "checkpoints", saves if opts.save else "never (no --save)", verb="takes")


def _batch_of(g: Graph) -> int:
    """Examples in a synthetic batch (1 for a model whose inputs have no common first axis)."""
    try:
        return batch_size(g)
    except SwpError:
        return 1


def _restore(g: Graph, stepper: Stepper, opts: Options, data_id: tuple[int, str] | None) -> int:
    """Load --resume (everything, and the step) or --init (parameters); the step to continue after.
    ``data_id``: the data's examples and fingerprint, which --resume's must match."""
    if opts.init:
        stepper.load_state(checkpoint.parameters(checkpoint.read(opts.init, "--init", wanted=checkpoint.for_init(g)),
                                                 g), 0)
        return 0
    if not opts.resume:
        return 0
    ck = checkpoint.read(opts.resume, "--resume")
    checkpoint.check_same_run(ck, g)
    if data_id is not None:
        checkpoint.check_same_contents(ck, opts.data, data_id)
    stepper.load_state(ck.values, ck.step)
    return ck.step


def _save(g: Graph, values: Mapping[str, np.ndarray], opts: Options, step: int,
          data_id: tuple[int, str] | None) -> SaveRecord:
    assert opts.save is not None
    started = time.perf_counter()
    data = opts.data if opts.data == SYNTHETIC else os.path.abspath(opts.data)  # (resumed from anywhere)
    nbytes = checkpoint.save(opts.save, g, values, step, step, opts.seed or 0, data, opts.shuffle, data_id)
    return SaveRecord(step, opts.save, nbytes, 1e3 * (time.perf_counter() - started))


def _gave_up(g: Graph, metrics: Mapping[str, float]) -> bool:
    """A guarded step that skipped its update and should not go on: any, without loss scaling; with it,
    once the scale has fallen below MIN_LOSS_SCALE (smaller skipped steps are how the scale is found)."""
    if g.guard == "none" or metrics.get("finite", 1.0) == 1.0:
        return False
    return g.guard == "skip" or metrics.get("loss_scale", 0.0) < MIN_LOSS_SCALE


def _why_skipped(step: int, metrics: Mapping[str, float]) -> str:
    scale = metrics.get("loss_scale")
    return (f"a gradient of step {step} is not finite, so its update was skipped"
            + (f", and the loss scale has fallen to {scale:g}" if scale is not None else ""))


def _half(g: Graph) -> bool:
    """Whether the run computes anything in half precision (by the policy, or as the model declares it)."""
    return g.precision != "f32" or any(g.type_of(p).dtype.label in ("f16", "bf16") for p in g.params)


def _nonfinite(g: Graph, opts: Options, start: int, step: int, what: str, ds: Dataset | None,
               order: Order | None) -> SwpError:
    """The error a non-finite step stops with, naming the op that made the first NaN or infinity (found by
    replaying this run's steps on the reference executor, where that is cheap enough)."""
    if g.ranks > 1:  # every rank stops at the same step (the loss is their mean): said once, not replayed
        err = nonfinite.nonfinite_error(what, None, True, _half(g))
        return dist.EveryRank(err.message, notes=["data-parallel runs do not replay to find the op; replay one "
                                                  "rank's configuration with `exec MODEL.swp`"], hints=err.hints)
    culprit, replayed = None, nonfinite.replayable(g, start + 1, step)
    if replayed:
        origin = _origin(g, opts)

        def batch(s: int) -> Batch | None:
            return gather(ds, order.indices(s - 1)) if ds is not None and order is not None else None

        culprit = nonfinite.first_nonfinite(g, opts.seed or 0, origin, start + 1, step, batch)
    return nonfinite.nonfinite_error(what, culprit, replayed, _half(g))


def _origin(g: Graph, opts: Options) -> dict[str, np.ndarray] | None:
    """The persistent values this run started from (None: the seed's), read again from the checkpoint."""
    if opts.init:
        return checkpoint.parameters(checkpoint.read(opts.init, "--init", wanted=checkpoint.for_init(g)), g)
    if opts.resume:
        return checkpoint.read(opts.resume, "--resume").values
    return None


def _emit(hook: Callable | None, record: StepRecord | EvalRecord | SaveRecord, log: BinaryIO | None,
          event: str) -> None:
    if log is not None:
        append(log, {"event": event, **attrs.asdict(record)})
    if hook is not None:
        hook(record)


@attrs.frozen
class Held:
    """A state to evaluate from with nothing training it (``swapdsl predict`` on data with its targets)."""

    values: dict[str, np.ndarray]
    steps_run: int = 0

    def state(self, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        return self.values if names is None else {k: v for k, v in self.values.items() if k in names}

    def load_state(self, state: dict[str, np.ndarray], steps: int) -> None:
        pass  # (the evaluation's executors share no arena with it)


@attrs.frozen
class Evaluator:
    """Evaluation by ``forward`` (an executor of ``autodiff.evaluation_graph``) from ``trainer``'s state: the
    loss and reports over the held-out data, each batch weighed by its examples; the last partial batch
    by ``tail(rows)``, an executor of the evaluation graph at that batch, at most ``tail_rows`` rows at a
    time (None from ``tail``: the rest is left out).
    ``forward`` and ``tail``'s may share ``trainer``'s device arena (a plan's evaluation runs inside the
    training plan's cap), so the trainer's state is put back."""

    trainer: Stepper
    forward: Stepper
    tail: Callable[[int], Stepper | None] | None = None
    tail_rows: int | None = None

    def __call__(self, ds: Dataset, step: int) -> EvalRecord:
        """The evaluation of ``ds`` after ``step``."""
        started = time.perf_counter()
        state = self.trainer.state()
        self.forward.load_state(state, self.forward.steps_run)
        parts = [_evaluated(self.forward, gather(ds, slice(k * ds.batch, (k + 1) * ds.batch)), ds.batch)
                 for k in range(ds.batches_per_epoch)]
        left, at = ds.dropped, ds.batches_per_epoch * ds.batch
        while left and (extra := self._tail(left)) is not None:
            rows = min(left, self.tail_rows or left)
            extra.load_state(state, extra.steps_run)
            parts.append(_evaluated(extra, gather(ds, slice(at, at + rows)), rows))
            left, at = left - rows, at + rows
        self.trainer.load_state(state, self.trainer.steps_run)
        return held_out(ds, step, parts, left, started)

    def check(self, ds: Dataset) -> None:
        """Refuse, before training, held-out data that no evaluation could take: fewer examples than a batch,
        in a partial batch that does not plan under the cap."""
        if not ds.batches_per_epoch and self._tail(ds.dropped) is None:
            held_out(ds, 0, [], ds.dropped, 0.0)  # (its error)

    def _tail(self, left: int) -> Stepper | None:
        return None if self.tail is None else self.tail(min(left, self.tail_rows or left))


def held_out(ds: Dataset, step: int, parts: list[tuple[float, dict[str, float], int]], left: int,
             started: float) -> EvalRecord:
    """The evaluation of ``ds`` after ``step`` from each batch's (loss, reports, rows), weighed by rows;
    ``left`` examples left out; timed from ``started`` (``time.perf_counter``)."""
    if not parts:
        raise SwpError(f"none of the {ds.examples} examples of `{ds.path}` could be evaluated: a partial batch "
                       f"of {ds.examples} does not plan under the cap", hints=[f"give {ds.batch} examples or more"])
    n = sum(w for _, _, w in parts)
    mean = {name: sum(m[name] * w for _, m, w in parts) / n for name in parts[0][1]}
    return EvalRecord(step, sum(loss * w for loss, _, w in parts) / n, mean, n, left,
                      1e3 * (time.perf_counter() - started))


def _evaluated(forward: Stepper, batch: dict[str, np.ndarray], rows: int) -> tuple[float, dict[str, float], int]:
    forward.set_batch(batch)
    return forward.run_step(forward.steps_run + 1)[0], forward.metrics(), rows


class StopRequest(threading.Event):
    """Set by the first SIGINT or SIGTERM; ``signum`` says which."""

    signum: int = signal.SIGINT


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[StopRequest]:
    """Ctrl-C (or SIGTERM) sets the event instead of stopping mid-step; a second one stops at once.
    Off the main thread signals cannot be caught, and the event is never set."""
    stop = StopRequest()

    def handler(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt(signum)
        stop.signum = signum
        stop.set()

    try:
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield stop
        return
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)

"""Work split across ranks: which items a rank collects, its seeds, and the gather of what the ranks produced
(docs/scaling.md).

Under a Lightning strategy with world size ``W`` (DDP on CPU/gloo or GPU/nccl, one or several nodes), a
collection round is split by **contiguous blocks**: with ``n`` items, rank ``r`` takes items
``[start_r, end_r)`` where the first ``n % W`` ranks hold ``ceil(n / W)`` items and the others
``floor(n / W)`` (``numpy.array_split``'s rule). With ``W > n`` the ranks ``r >= n`` hold no item; they
still take part in every gather, so no rank waits forever. Gathering the ranks' lists in rank order then
gives back dataset order, the same order a single process produces.

Seeds: rank ``r`` derives every seed of its collection streams with :func:`rank_seed`
(``seed + RANK_SEED_STRIDE * r``), so rank 0 of a DDP run and a single process use the same seeds and a run
is reproducible for a fixed (seed, W).

Failures: :func:`gather_round` runs a rank's share of a round and gathers a status with its result, so an
exception on one rank stops every rank at the same point with a :class:`RankFailure` naming the rank and the
round, instead of the others waiting in the gather (docs/scaling.md, section 5).

Collectives called unequally: under FSDP2, ``generate`` of a sharded agent is a collective (the agent is gathered
whole for the call), yet a rank's block of a collection round may need fewer calls than another's (fewer items, or
none). Such a collective is registered (:func:`register_balanced`) and announced before each call
(:func:`announce_balanced`); :func:`gather_round` lets a rank that finished its work join the calls the others still
make (:func:`join_balanced`: its shards take part, it generates nothing) until every rank is done, so every rank runs
the same collectives in the same order and the round's results are those of its own items only. An evaluation under
FSDP2 is such a round too (:func:`comlrl_lightning.evaluation.balanced_evaluation`): every rank evaluates the same
items, but a task reward that differs between ranks (a sandbox timeout, a remote judge) can end an actor-critic
episode early on one rank only. Ranks that call balanced collectives out of order stop with an error naming both.

Gradients: :func:`average_gradients` averages one optimizer's gradients over the ranks, the reduction the team
modules run under DDP at each agent's own step instead of DDP's per-backward hooks (docs/scaling.md, "Strategies").

Without an initialized process group (one process, tests, notebooks) every function here is the identity
of the single-rank case; nothing imports Lightning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: Largest flat buffer of :func:`average_gradients`'s small gradients, in elements (64 MiB of float32).
GRADIENT_BUCKET_NUMEL = 16 * 1024 * 1024
#: Gradients of at least this many elements are all-reduced in place by :func:`average_gradients` (no copy); the
#: smaller ones travel together in flat buckets.
IN_PLACE_NUMEL = 1 << 20

#: Distance between the seeds of two ranks (a prime far above the per-agent offsets used by the streams).
RANK_SEED_STRIDE = 1_000_000_007


def rank_seed(seed: int, rank: int) -> int:
    """The seed rank ``rank`` uses in place of ``seed``: ``seed + RANK_SEED_STRIDE * rank`` (rank 0: ``seed``)."""
    return int(seed) + RANK_SEED_STRIDE * int(rank)


def shard_bounds(num_items: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, end)`` of rank ``rank``'s contiguous block of ``num_items`` items over ``world_size`` ranks.

    With ``q, m = divmod(n, W)``: rank r holds ``q + 1`` items if ``r < m`` else ``q``, and starts at
    ``r * q + min(r, m)``. Every item belongs to exactly one rank; blocks are in rank order.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size) with world_size >= 1; got rank={rank}, "
                         f"world_size={world_size}.")
    if num_items < 0:
        raise ValueError(f"num_items must be >= 0; got {num_items}.")
    q, m = divmod(int(num_items), int(world_size))
    start = rank * q + min(rank, m)
    return start, start + q + (1 if rank < m else 0)


def world(trainer: Any = None) -> tuple[int, int]:
    """``(rank, world_size)`` of this process: the trainer's ``global_rank`` / ``world_size`` when given, else
    the default process group's, else ``(0, 1)``."""
    if trainer is not None:
        return int(getattr(trainer, "global_rank", 0)), int(getattr(trainer, "world_size", 1))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _group_ready(world_size: int) -> bool:
    import torch.distributed as dist

    return world_size > 1 and dist.is_available() and dist.is_initialized()


def gather_objects(obj: Any, world_size: int) -> list[Any]:
    """Every rank's ``obj`` (any picklable value), in rank order, on every rank (``all_gather_object``).

    A collective: every rank of the group must call it at the same point, empty shards included. With one
    rank (or no process group) it returns ``[obj]``.
    """
    if not _group_ready(world_size):
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


#: Announced by a rank that has no balanced collective left to run in the current round.
DONE = -1
#: Balanced collectives by key: the function a rank calls to take part in another rank's call without running it.
_BALANCED: dict[int, Callable[[], Any]] = {}
#: What each balanced collective is, by key (for the errors of :func:`announce_balanced` / :func:`join_balanced`).
_NAMES: dict[int, str] = {}
_NEXT_KEY = [0]


def register_balanced(join: Callable[[], Any], name: str | None = None) -> int:
    """Register a collective that ranks may call a different number of times inside a round; ``join()`` takes
    part in one call of it without running it (e.g. gather and free a sharded agent's weights). ``name`` says what
    the collective is (e.g. "IAC evaluation: agent 0's critic values"), for the errors; without one it is read
    from ``join`` (:func:`describe_join`). Returns its key for :func:`announce_balanced`. Every rank registers the
    same collectives in the same order (the keys match)."""
    key = _NEXT_KEY[0]
    _NEXT_KEY[0] += 1
    _BALANCED[key] = join
    _NAMES[key] = name or describe_join(join)
    return key


def describe_join(join: Callable[[], Any]) -> str:
    """What a balanced collective registered without a name is, read from its ``join``: the function's name and
    its arguments, a weak reference as the class of what it refers to (``FSDP`` prefix dropped), e.g.
    ``"join_generate(Qwen2ForCausalLM)"`` (a sharded model's ``generate``, or a reward model's ``score``) or
    ``"join_part(VLLMEngine, ('model', 0))"`` (a vLLM engine's weight push)."""
    import weakref

    func = getattr(join, "func", join)
    words = []
    for arg in getattr(join, "args", ()):
        if isinstance(arg, weakref.ref):
            target = arg()
            words.append("<gone>" if target is None else type(target).__name__.removeprefix("FSDP"))
        else:
            words.append(repr(arg))
    return f"{getattr(func, '__name__', type(func).__name__).lstrip('_')}({', '.join(words)})"


def _named(keys: Any) -> str:
    return ", ".join(f"#{k} {_NAMES.get(k, 'unregistered')}" for k in sorted(keys))


_OUT_OF_STEP = ("the ranks' balanced collectives (a sharded model's generate or reward-model score, a vLLM engine's "
                "weight push, an evaluation's critic or KL pass under FSDP2) went out of step. Every rank must run "
                "them in the same order, e.g. sample the agents in the same order (docs/scaling.md, \"FSDP2\").")


def _exchange(key: int) -> list[int]:
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor([key], dtype=torch.int64, device=device)
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [int(t.item()) for t in out]


def announce_balanced(key: int) -> None:
    """Before this rank runs balanced collective ``key``: tell the others (a small all-gather). A rank that is
    done (in :func:`join_balanced`) joins the call; a rank that announces another collective at the same point is
    an error on every rank naming both collectives (the ranks' calls went out of step), never a hang."""
    if world()[1] < 2:
        return
    keys = _exchange(key)
    others = {k for k in keys if k not in (key, DONE)}
    if others:
        raise RuntimeError(f"Ranks run different collectives at the same point (this rank: {_named([key])}; other "
                           f"ranks: {_named(others)}): {_OUT_OF_STEP}")


def join_balanced() -> int:
    """A rank that finished its share of a round: take part in the balanced collectives the other ranks still run,
    until every rank has announced it is done. Returns the number of calls joined. Nothing without registered
    balanced collectives or a process group (the ranks agree on both)."""
    if not _BALANCED or world()[1] < 2:
        return 0
    joined = 0
    while True:
        running = {k for k in _exchange(DONE) if k != DONE}
        if not running:
            return joined
        if len(running) > 1:
            raise RuntimeError(f"Ranks run different collectives at the same point ({_named(running)}; this rank is "
                               f"done): {_OUT_OF_STEP}")
        _BALANCED[running.pop()]()
        joined += 1


class RankFailure(RuntimeError):
    """A rank failed during a round's collective step; raised on every rank, naming the failed rank(s)."""


def gather_round(work: Callable[[], Any], rank: int, world_size: int, where: str) -> list[Any]:
    """Run this rank's ``work()`` and gather every rank's result, in rank order (a collective, as
    :func:`gather_objects`).

    An exception raised by ``work`` on any rank is gathered in place of that rank's result, so every rank
    learns who failed and raises a :class:`RankFailure` naming the rank(s), ``where`` (e.g. the round) and the
    error, before anything of the round is used or written (the failing rank chains its own exception). A rank
    whose process dies never reaches the gather: the collective itself fails on the others (gloo and nccl
    raise once the peer's connection closes; a rank that hangs alive is caught by the process group's
    timeout, ``DDPStrategy(timeout=...)``), and that error is raised as a :class:`RankFailure` naming
    ``where``. With one rank (or no process group) ``work``'s exceptions pass unchanged.

    Before the gather, a rank whose ``work`` made fewer calls of a balanced collective (a sharded agent's
    ``generate`` under FSDP2, :func:`register_balanced`) joins the calls the others still make
    (:func:`join_balanced`), so a block with fewer items, or none, never leaves another rank waiting.
    """
    if not _group_ready(world_size):
        return [work()]
    error: BaseException | None = None
    try:
        status: tuple[str | None, Any] = (None, work())
    except Exception as exc:  # noqa: BLE001 - every rank must reach the gather to learn of the failure
        error, status = exc, (f"{type(exc).__name__}: {exc}", None)
    try:
        join_balanced()  # a rank with fewer generate calls of sharded agents joins the others' (FSDP2)
        statuses = gather_objects(status, world_size)
    except RuntimeError as exc:  # gloo/nccl: a peer's process died or the collective timed out
        raise RankFailure(
            f"{where}: the gather of the ranks' results failed on rank {rank} ({type(exc).__name__}: {exc}). Another "
            "rank stopped before reaching it (its process died, was killed, or hung past the process group's "
            "timeout): look for the first error in the other ranks' logs. Nothing of this round was used or "
            "written; resume from the last checkpoint with the same number of processes.") from exc
    failed = {r: message for r, (message, _) in enumerate(statuses) if message is not None}
    if failed:
        names = "; ".join(f"rank {r}: {m}" for r, m in failed.items())
        raise RankFailure(
            f"{where} failed on rank {', '.join(map(str, failed))} of {world_size} ({names}). Every rank stops here: "
            "nothing of this round was used or written. Fix the cause and resume from the last checkpoint "
            "(fit(ckpt_path=...)) with the same number of processes.") from error
    return [result for _, result in statuses]


def broadcast_object(obj: Any, world_size: int, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (a collective; with one rank: ``obj``)."""
    if not _group_ready(world_size):
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def per_rank_entry(states: Any, rank: int, world_size: int, what: str) -> Any:
    """Rank ``rank``'s entry of a checkpoint's per-rank list ``states`` (saved by a run of ``len(states)`` ranks).

    A checkpoint written with another world size cannot continue the ranks' own streams: that is refused with
    a ``ValueError`` naming both sizes (resume with the same number of processes, or start a new run).
    """
    if not isinstance(states, list):
        raise ValueError(f"{what}: the checkpoint's per-rank state must be a list; got {type(states).__name__}.")
    if len(states) != world_size:
        raise ValueError(
            f"{what}: the checkpoint was written by a run with world size {len(states)} (processes across all nodes) "
            f"and this run has world size {world_size}. Each rank's sampling streams are saved per rank, so a run "
            f"resumes only with the same world size: relaunch with {len(states)} processes in total (devices x "
            "num_nodes), or start a new run from the exported agents.")
    return states[rank]


def average_gradients(params: list[torch.Tensor], world_size: int, bucket_numel: int = GRADIENT_BUCKET_NUMEL,
                      in_place_numel: int = IN_PLACE_NUMEL) -> int:
    """Average the ``.grad`` of ``params`` over the ranks, in place, and return the number of ``all_reduce`` calls.

    A collective: every rank calls it with the same parameters (same order, shapes, dtypes, devices), e.g. those of
    one agent's optimizer just before its step. Gradients of at least ``in_place_numel`` elements are summed in
    place (no copy); the smaller ones are copied into flat buckets (one per device and dtype, split at
    ``bucket_numel`` elements), so that many small tensors cost few calls. Every ``all_reduce`` is started
    asynchronously and awaited at the end; the sums are then divided by ``world_size``: DDP's average. One more
    small ``all_reduce`` counts, per parameter, the ranks that hold a gradient: a parameter with no gradient on
    some ranks counts as zero there (as DDP with ``find_unused_parameters``), and one with no gradient on any
    rank keeps ``grad=None`` (the optimizer skips it, as it would in one process). With one rank (or no process
    group) nothing happens.
    """
    if not _group_ready(world_size) or not params:
        return 0
    import torch.distributed as dist

    has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
    works = [dist.all_reduce(has_grad, async_op=True)]
    for p in params:  # a rank without a gradient adds zeros
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    small: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for p in params:
        if p.grad.numel() >= in_place_numel and p.grad.is_contiguous():
            works.append(dist.all_reduce(p.grad, async_op=True))
        else:
            small.setdefault((p.grad.device, p.grad.dtype), []).append(p)
    buckets: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
    for members in small.values():
        start = 0
        while start < len(members):
            bucket, size = [], 0
            while start < len(members) and (not bucket or size + members[start].numel() <= bucket_numel):
                bucket.append(members[start])
                size += members[start].numel()
                start += 1
            flat = torch.cat([p.grad.detach().reshape(-1) for p in bucket])
            works.append(dist.all_reduce(flat, async_op=True))
            buckets.append((flat, bucket))
    for work in works:
        work.wait()
    in_place = [p.grad for p in params if p.grad.numel() >= in_place_numel and p.grad.is_contiguous()]
    if in_place:
        torch._foreach_div_(in_place, world_size)
    for flat, bucket in buckets:  # the division and the copy back in one pass, as DDP's reducer does
        offset = 0
        for p in bucket:
            n = p.numel()
            torch.div(flat[offset:offset + n].view_as(p.grad), world_size, out=p.grad)
            offset += n
    for p, count in zip(params, has_grad.tolist()):
        if count == 0:
            p.grad = None
    return len(works)

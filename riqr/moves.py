"""Moving query actors between nodes while queries and batches go on: ``riqr rebalance`` and ``riqr drain``;
and adding standby copies to a store the same way, or removing them: ``riqr standbys``.

The plan and the switch's check are pure (``runtime.moves``); the registry makes each step atomic
(``Registry.join``, ``Registry.admit``, ``Registry.switch``, ``Registry.abandon_move``; for a standby added,
``Registry.add_standby`` and ``Registry.keep`` in place of the join and the switch); this module drives
one move after another from the caller's process (the CLI, or Python code connected to the cluster),
watching the new copy catch up and saying how far it is. A move that does not finish in time, or whose driver is stopped
(Ctrl-C), is given up: the new actor is destroyed and the old one stays as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from runtime import raycalls
from runtime.config import DEFAULT_MOVE_TIMEOUT, REGISTRY_NAME
from runtime.errors import DeadlineExceeded, InternalError, OwnerUnavailable, RiqrError, Unavailable
from runtime.moves import Move, behind, plan_moves, plan_standby_removals, plan_standbys
from runtime.ownership import ClusterView, OwnershipTable

__all__ = [
    "MoveDone",
    "MoveFailed",
    "plan",
    "plan_standby_copies",
    "Removal",
    "plan_removals",
    "remove_standbys",
    "move",
    "rebalance",
    "add_standbys",
    "wait_until_deleted",
    "copies",
    "describe",
    "DEFAULT_MOVE_TIMEOUT",
]

# How long one move may take, from the new actor's start to the switch (a large partition's copy over
# the network takes most of it).
# How often the mover looks at the two copies, and says how far the copy is.
_LOOK_EVERY = 0.2
_SAY_EVERY = 5.0
# A new copy serving but behind the old one, with no batch arriving to show it a gap, for this long, is
# copied again (the batch it lacks reached only the old copies, before it joined the table).
_STILL_FOR = 3.0
_CALL_TIMEOUT = 30.0
# Starting the new actor: Ray may have to start a worker process on the target node first. The registry
# gives a move up whose new actor is not admitted within MOVE_START_SECONDS (above this and a call).
_JOIN_TIMEOUT = 120.0
# A new actor's name is listed once Ray registered it; one never listed within this is not starting.
_LISTED_WITHIN = 10.0


class MoveFailed(Unavailable):
    """A move could not be made or finished (what became of its new actor, if it had one, is said)."""

    code = "move-failed"


@dataclass(frozen=True)
class MoveDone:
    """A move made: the actor that took ``move.uuid``'s place (or, for a standby added, that holds the new
    copy), how long it took, the switch's epoch (the keep's)."""

    move: Move
    new_uuid: str
    seconds: float
    epoch: int


@dataclass(frozen=True)
class Removal:
    """Standby copies to remove (``riqr standbys`` with fewer): query actor ``uuid`` of ``store`` on
    ``node``, with its copies of ``partitions``."""

    store: str
    uuid: str
    node: str
    partitions: tuple[int, ...]

    def describe(self) -> str:
        return (f"store {self.store}: query actor {self.uuid} on node {_node(self.node)}, its standby copies of "
                f"partitions {_parts(self.partitions)}")  # fmt: skip


def plan(
    namespace: str, *, drain: Sequence[str] = (), stores: Sequence[str] | None = None
) -> tuple[ClusterView, list[Move]]:
    """The registry's view and the moves ``rebalance`` would make (``runtime.moves.plan_moves``)."""
    view: ClusterView = raycalls.get(registry_of(namespace).view.remote(), "registry view", timeout=_CALL_TIMEOUT)
    alive = alive_nodes()
    unknown = sorted(set(drain) - set(alive))
    if unknown:
        raise MoveFailed(f"no live node {', '.join(unknown)} to drain (live nodes: {', '.join(sorted(alive))})")
    missing = sorted(set(stores or ()) - set(view.tables))
    if missing:
        raise MoveFailed(f"no store {', '.join(missing)} in namespace {namespace!r}")
    if drain and not set(alive) - set(drain):
        raise MoveFailed("draining every live node would leave the stores nowhere to go")
    chosen = None if stores is None else set(stores)
    return view, plan_moves(view, alive, drain=set(drain), stores=chosen)


def rebalance(
    namespace: str,
    *,
    drain: Sequence[str] = (),
    stores: Sequence[str] | None = None,
    timeout: float = DEFAULT_MOVE_TIMEOUT,
    say: Callable[[str], None] = print,
) -> list[MoveDone]:
    """Make the moves ``plan`` gives, one after another; returns them. Stops at the first that fails
    (``MoveFailed``; the moves before it stay made)."""
    _, moves = plan(namespace, drain=drain, stores=stores)
    if not moves:
        say("nothing to move: every store's query actors are spread evenly over the live nodes"
            + (", and none is on the nodes to drain" if drain else ""))  # fmt: skip
        return []
    say(f"{len(moves)} move(s) to make, one after another")
    return _one_after_another(namespace, moves, timeout, say)


def _one_after_another(
    namespace: str, moves: Sequence[Move], timeout: float, say: Callable[[str], None]
) -> list[MoveDone]:
    """Make ``moves`` (or add the copies) in order, saying each; the first that fails raises."""
    done = []
    for i, m in enumerate(moves, 1):
        say(f"[{i}/{len(moves)}] {describe(m)}")
        done.append(move(namespace, m, timeout=timeout, say=say))
    return done


def copies(n: int) -> str:
    """``n`` standby copies, in words."""
    return f"{n} standby cop{'y' if n == 1 else 'ies'}"


def plan_removals(namespace: str, store: str, wanted: int) -> list[Removal]:
    """The standby copies ``remove_standbys`` would remove so that no partition of ``store`` has more than
    ``wanted`` (``runtime.moves.plan_standby_removals``: whole query actors that answer for no partition).
    ``MoveFailed``, before anything is removed, when some partitions would have more all the same."""
    view = _view_with(namespace, store)
    table = view.tables[store]
    removed, left = plan_standby_removals(view, alive_nodes(), store, wanted)
    if left:
        most = max(len(table.partitions[p].standbys) for p in left)
        raise MoveFailed(f"partitions {_parts(left)} of store {store} would keep up to {copies(most)}: their other "
                         "copies are on query actors that also answer for partitions (the store's own actors, "
                         "whose partitions are fixed when they start, or copies a failover or a registry "
                         "restart made answer), and only whole actors that answer for none can go; nothing "
                         f"was removed (`riqr status` shows each store's copies per actor)")  # fmt: skip
    owners = table.all_owners()
    return [Removal(store, u, view.actors[u].node_id if u in view.actors else "", tuple(owners[u])) for u in removed]


def remove_standbys(namespace: str, store: str, wanted: int, *, say: Callable[[str], None] = print) -> list[Removal]:
    """Remove standby copies of ``store`` so that no partition has more than ``wanted``, one query actor after
    another (``Registry.remove_standby``: out of the table at once, destroyed with its data after a grace
    for reads already sent to it), then wait for their deletion. ``MoveFailed`` if the plan cannot reach
    ``wanted`` (nothing removed) or an actor is not deleted in time; a removal the registry refuses
    (``Conflict``: a failover made it answer for a partition meanwhile, say) stops there, the ones
    before it made."""
    _settle(namespace, store, say)
    planned = plan_removals(namespace, store, wanted)
    if not planned:
        return []
    say(f"{copies(len(planned))} to remove from store {store}, one after another")
    reg = registry_of(namespace)
    for i, r in enumerate(planned, 1):
        try:
            out = raycalls.get(reg.remove_standby.remote(r.uuid, wanted), "removing a standby copy",
                               timeout=_CALL_TIMEOUT)  # fmt: skip
        except RiqrError as err:
            if i > 1:
                say(f"[{i}/{len(planned)}] not removed: {err.message}; the {i - 1} removed before stay removed")
            raise
        say(f"[{i}/{len(planned)}] removed {r.describe()} (epoch {out['epoch']}; the fewest standby copies "
            f"of a partition now: {out['standbys']})")  # fmt: skip
    left = wait_until_deleted(namespace, [r.uuid for r in planned], say=say)
    if left:
        raise MoveFailed(f"the removed copies' query actors {', '.join(left)} were not deleted within "
                         f"{_DELETED_WITHIN:.0f}s: the registry deletes them at its next checks")  # fmt: skip
    return planned


def _view_with(namespace: str, store: str) -> ClusterView:
    """The registry's view, which must have ``store`` (``MoveFailed`` if not)."""
    view: ClusterView = raycalls.get(registry_of(namespace).view.remote(), "registry view", timeout=_CALL_TIMEOUT)
    if view.table(store) is None:
        raise MoveFailed(f"no store {store} in namespace {namespace!r}")
    return view


def _settle(namespace: str, store: str, say: Callable[[str], None]) -> None:
    """Copies an earlier run added and could not keep (stopped after their admission) first: kept if they
    caught up since, so they count as what they are (``Registry.settle_standbys``), and said."""
    settled = raycalls.get(
        registry_of(namespace).settle_standbys.remote(store), "settling copies", timeout=_CALL_TIMEOUT
    )
    for uuid in settled.get("kept", []):
        say(f"kept standby copy {uuid} of store {store}, added by an earlier run that was stopped: it caught up")
    if settled["pending"]:
        raise MoveFailed(f"standby copies of store {store} added by an earlier run are still catching up "
                         f"({', '.join(settled['pending'])}): run it again once they serve")  # fmt: skip


def plan_standby_copies(namespace: str, store: str, wanted: int) -> tuple[int, list[Move]]:
    """How many standby copies each partition of ``store`` has now (the fewest of any), and the copies
    ``add_standbys`` would add to give each ``wanted`` (``runtime.moves.plan_standbys``; none for a partition
    that has that many or more). ``MoveFailed`` for more than the live nodes can each hold one of (one
    node: one copy in another process)."""
    view = _view_with(namespace, store)
    table = view.tables[store]
    has = table.fewest_standbys()
    alive = alive_nodes()
    most = max(1, len(alive) - 1)
    if wanted > max(has, most):  # removing copies needs no live node
        raise MoveFailed(f"{copies(wanted)} of each partition need {wanted + 1} live nodes, one copy each; "
                         f"{len(alive)} {'is' if len(alive) == 1 else 'are'} live, so {most} at most")  # fmt: skip
    unassigned = table.unassigned()
    if unassigned and wanted > has:
        raise MoveFailed(f"partitions {_parts(unassigned)} of store {store} have no active copy to copy: try again "
                         "once they have one (riqr status shows their state)")  # fmt: skip
    return has, plan_standbys(view, alive, store, wanted)


def add_standbys(
    namespace: str,
    store: str,
    wanted: int,
    *,
    timeout: float = DEFAULT_MOVE_TIMEOUT,
    say: Callable[[str], None] = print,
) -> list[MoveDone]:
    """Give every partition of ``store`` ``wanted`` standby copies while queries and batches go on: each
    new copy is a new query actor that copies its partitions from live copies, catches up and stays
    (``move`` with ``Move.standby``), one after another. Stops at the first that fails (``MoveFailed``;
    the copies added before it stay)."""
    _settle(namespace, store, say)
    has, planned = plan_standby_copies(namespace, store, wanted)
    if not planned:
        say(f"nothing to add: every partition of store {store} has {copies(has)} or more")
        return []
    say(f"{copies(len(planned))} to add to store {store}, one after another")
    return _one_after_another(namespace, planned, timeout, say)


def move(
    namespace: str, m: Move, *, timeout: float = DEFAULT_MOVE_TIMEOUT, say: Callable[[str], None] = print
) -> MoveDone:
    """Move query actor ``m.uuid`` to node ``m.target``: copy, catch up, switch, drop (``runtime.moves``);
    for ``m.standby``, copy, catch up and keep: a new standby copy of ``m.partitions`` on ``m.target``.
    A move that fails or is stopped is given up (``Registry.abandon_move``), unless its switch was made
    already: then it counts as made (a stop still stops the caller)."""
    reg = registry_of(namespace)
    started = time.monotonic()
    _refuse_without_a_serving_copy(namespace, reg, m)
    new = _join(reg, m, say)
    try:
        _admit(namespace, reg, m, new, min(started + timeout, time.monotonic() + _JOIN_TIMEOUT))
        say(f"  new actor {new} on node {_node(m.target)}: copying partitions {_parts(m.partitions)} from live "
            "copies")  # fmt: skip
        epoch = _until_switched(namespace, reg, m, new, started + timeout, say)
    except BaseException as err:
        reason = err.message if isinstance(err, RiqrError) else "stopped"
        try:
            out = raycalls.get(reg.abandon_move.remote(m.uuid, new), "giving the move up", timeout=_CALL_TIMEOUT)
        except RiqrError as undone:
            say(f"  gave the move up ({reason}), but the registry could not be told: {undone.message}")
            raise err from None
        if out["outcome"] != "switched":
            if out["outcome"] == "none":  # in no table, and no longer a move the registry knows (it restarted
                _stop_unlisted(namespace, reg, m.store, new)  # before admitting it): nothing else stops it
            said = {
                "kept": f"the new actor {new} stays, a copy like any other ({out.get('why')})",
                "given-up": f"the new actor is destroyed; {m.uuid} stays where it was",
            }.get(out["outcome"], "the registry no longer lists the new actor: it is stopped")
            say(f"  gave the move up ({reason}): {said}")
            raise
        epoch = int(out["epoch"])
        say(f"  the switch was made before the move was given up ({reason})")
        if not isinstance(err, RiqrError):
            raise
    seconds = time.monotonic() - started
    if m.standby:
        say(f"  caught up in {seconds:.1f}s (epoch {epoch}): {new} keeps a standby copy of partitions "
            f"{_parts(m.partitions)}")  # fmt: skip
    else:
        say(f"  switched in {seconds:.1f}s (epoch {epoch}): {new} {_holds(namespace, m, new)}; "
            f"{m.uuid} is destroyed with its data after a short grace")  # fmt: skip
    return MoveDone(m, new, seconds, epoch)


def _stop_unlisted(namespace: str, reg: Any, store: str, new: str) -> None:
    """Kill the move's new actor if the registry's table does not list it (it was never admitted, and the
    registry that asked for it restarted): a copy of nothing, which nobody else would stop."""
    try:
        view: ClusterView = raycalls.get(reg.view.remote(), "registry view", timeout=_CALL_TIMEOUT)
        table = view.table(store)
        if new in view.actors or (table is not None and new in table.all_owners()):
            return
        ray.kill(ray.get_actor(new, namespace=namespace), no_restart=True)
    except (RiqrError, ValueError):  # the registry cannot say, or the actor is gone already
        return


def _refuse_without_a_serving_copy(namespace: str, reg: Any, m: Move) -> None:
    """``MoveFailed`` when a partition of the move has no copy that serves now: there is nothing to copy."""
    view: ClusterView = raycalls.get(reg.view.remote(), "registry view", timeout=_CALL_TIMEOUT)
    table = view.table(m.store)
    if table is None or m.uuid not in table.all_owners():
        raise MoveFailed(f"query actor {m.uuid} of store {m.store} is no longer in its table: plan again")
    served: set[int] = set()
    for uuid, held in table.all_owners().items():
        if not set(held) & (set(m.partitions) - served):
            continue
        try:
            positions = raycalls.get(_actor(namespace, uuid).positions.remote(), "positions", timeout=5, actor=uuid)
        except RiqrError:
            continue
        served |= {p for p, pos in positions.items() if pos.get("state") == "serving"}
    dark = sorted(set(m.partitions) - served)
    if dark:
        raise MoveFailed(f"partitions {_parts(dark)} of store {m.store} have no copy that serves now, so none can be "
                         "copied: move it once they serve again (riqr status shows their state)")  # fmt: skip


def _join(reg: Any, m: Move, say: Callable[[str], None]) -> str:
    """``Registry.join``: the new actor is asked for (the registry does not wait for its start); a stop
    while the call runs waits for its answer, then gives the move up."""
    if m.standby:
        ref = reg.add_standby.remote(m.uuid, m.target, list(m.partitions))
    else:
        ref = reg.join.remote(m.uuid, m.target)
    try:
        joined = raycalls.get(ref, "asking for the new actor", timeout=_CALL_TIMEOUT)
    except KeyboardInterrupt:
        say("  stopping: waiting for the registry's answer, to give the move up")
        try:
            new = str(raycalls.get(ref, "asking for the new actor", timeout=_CALL_TIMEOUT)["uuid"])
            raycalls.get(reg.abandon_move.remote(m.uuid, new), "giving the move up", timeout=_CALL_TIMEOUT)
            say(f"  gave the move up: the new actor is destroyed; {m.uuid} stays where it was")
        except RiqrError as err:
            say(f"  could not give the move up ({err.message}): the next move of {m.uuid}, or the registry's "
                "check, does")  # fmt: skip
        raise
    return str(joined["uuid"])


def _admit(namespace: str, reg: Any, m: Move, new: str, deadline: float) -> None:
    """Wait until the new actor answers (its process starts on the target node), then ``Registry.admit``:
    it joins the table and starts its copy. ``MoveFailed`` past ``deadline``, or at once when Ray says the
    actor died (its constructor failed), with why."""
    listed_by = time.monotonic() + _LISTED_WITHIN
    while True:
        try:
            handle = _actor(namespace, new)
            raycalls.get(handle.ready.remote(), "starting the new actor", timeout=max(0.1, deadline - time.monotonic()),
                         actor=new)  # fmt: skip
            break
        except OwnerUnavailable as err:  # dead, not slow: waiting would only hide why
            raise MoveFailed(f"the new actor {new} did not start: {err.message}", actor=new) from None
        except MoveFailed as err:  # not listed by its name (yet)
            if time.monotonic() >= min(deadline, listed_by):
                raise MoveFailed(f"the new actor {new} did not start ({err.message})", actor=new) from None
        except DeadlineExceeded:
            raise MoveFailed(f"the new actor {new} did not start in time", actor=new) from None
        time.sleep(_LOOK_EVERY)
    raycalls.get(reg.admit.remote(m.uuid, new), "adding the new actor to the table", timeout=_CALL_TIMEOUT)


def _until_switched(namespace: str, reg: Any, m: Move, new: str, deadline: float, say: Callable[[str], None]) -> int:
    """Watch the new copy catch up (asking it to copy again where it is stuck) and ask the registry to
    switch once it holds what the old copy holds; returns the switch's epoch. An actor that cannot be
    reached (restarting, re-created on another node) is asked again until the move's deadline."""
    handles: dict[str, Any] = {}

    def ask(uuid: str, method: str, *args: Any) -> Any:
        try:
            handle = handles.get(uuid) or handles.setdefault(uuid, _actor(namespace, uuid))
            return raycalls.get(getattr(handle, method).remote(*args), method, timeout=_CALL_TIMEOUT, actor=uuid)
        except RiqrError:
            handles.pop(uuid, None)  # looked up again: it may run elsewhere now
            raise

    still: dict[int, tuple[Any, float]] = {}  # partition -> (its new copy's position, since when)
    said = time.monotonic()
    progress, failing = "nothing compared yet", ""
    while True:
        now = time.monotonic()
        if now > deadline:
            raise MoveFailed(f"the new copy did not catch up within the move's timeout ({progress}{failing})")
        try:
            old_pos, new_pos = ask(m.uuid, "positions"), ask(new, "positions")
            if m.standby:  # the source holds other partitions too
                old_pos = {p: pos for p, pos in old_pos.items() if int(p) in m.partitions}
            late = behind(old_pos, new_pos)
            if not late:
                last = reg.keep.remote(m.uuid, new) if m.standby else reg.switch.remote(m.uuid, new)
                out = raycalls.get(last, "keeping the copy" if m.standby else "switching over", timeout=_CALL_TIMEOUT)
                if out.get("kept" if m.standby else "switched"):
                    return int(out["epoch"])
                late, old_pos, new_pos = out["behind"], out["old"], out["new"]
            progress = _progress(old_pos, new_pos)
            again = _stuck(late, new_pos, still, now)
            if again:
                _catch_up(ask, new, again, m.uuid)
                for p in again:
                    still.pop(p, None)
            failing = ""
        except (OwnerUnavailable, DeadlineExceeded, MoveFailed) as err:
            failing = f"; last try: {err.message}"
            switched = _switched_already(reg, m, new)  # a switch whose answer was lost, an actor gone
            if switched is not None and not m.standby:  # a keep whose answer was lost is asked again
                return switched
        if now - said >= _SAY_EVERY:
            say(f"  {progress}{failing}")
            said = now
        time.sleep(_LOOK_EVERY)


def _catch_up(ask: Callable[..., Any], new: str, partitions: list[int], source: str) -> None:
    """Ask the new copy to copy ``partitions`` again, from ``source`` (the copy it replaces) first: it holds
    what the new copy must reach, where the active, asked first otherwise, may be a batch behind it (a
    standby is fed first), and a copy that took the active's again at every ask never caught up (a
    black-box run's drain spun until its timeout). An actor of a riqr before ``prefer`` is asked without."""
    try:
        ask(new, "catch_up", partitions, source)
    except InternalError as err:
        if not raycalls.refused_arguments(err):
            raise
        ask(new, "catch_up", partitions)


def _switched_already(reg: Any, m: Move, new: str) -> int | None:
    """The epoch if the registry's table has ``new`` in ``m.uuid``'s place already (a switch whose answer
    was lost); ``MoveFailed`` if the store or the new actor left it (dropped, given up by another mover);
    None otherwise, or when the registry cannot be asked."""
    try:
        view: ClusterView = raycalls.get(reg.view.remote(), "registry view", timeout=_CALL_TIMEOUT)
    except RiqrError:
        return None
    table = view.table(m.store)
    if table is None or new not in table.all_owners():
        raise MoveFailed(f"store {m.store} or its new actor {new} is no longer in the registry's table")
    return view.epoch if m.uuid not in table.all_owners() else None


def _stuck(late: Sequence[int], positions: Mapping[int, Mapping[str, Any]], still: dict[int, tuple[Any, float]],
           now: float) -> list[int]:  # fmt: skip
    """The partitions of the new copy to copy again: those not serving and not copying (a copy given up,
    or a gap it does not mend by itself), and those serving behind the old copy without moving for
    ``_STILL_FOR`` seconds."""
    out = []
    for p in late:
        pos = positions.get(p, {})
        state = pos.get("state")
        if state == "catching-up":
            still.pop(p, None)
        elif state != "serving":
            out.append(p)
        else:
            mark = (pos.get("source"), pos.get("batch_id"))
            seen = still.get(p)
            if seen is None or seen[0] != mark:
                still[p] = (mark, now)
            elif now - seen[1] >= _STILL_FOR:
                out.append(p)
    return out


def _progress(old: Mapping[int, Mapping[str, Any]], new: Mapping[int, Mapping[str, Any]]) -> str:
    ready = len(old) - len(behind(old, new))
    states = sorted({str(pos.get("state")) for p, pos in new.items() if p in behind(old, new)})
    rest = f"; the others: {', '.join(states)}" if states else ""
    return f"{ready} of {len(old)} partitions caught up{rest}"


# How long ``wait_until_deleted`` waits for the old copies of moves (MOVE_LEAVE_GRACE, then the
# registry's next check, then each deletes its data).
_DELETED_WITHIN = 60.0


def wait_until_deleted(
    namespace: str, uuids: Sequence[str], *, timeout: float = _DELETED_WITHIN, say: Callable[[str], None] = print
) -> list[str]:
    """Wait until the old actors of moves made (``MoveDone.move.uuid``) are gone: each deletes its data
    before it is killed, once the grace for reads already sent to it has passed. Returns those still there
    after ``timeout`` (a node may be stopped once none is)."""
    left = set(uuids)
    if left:
        say(f"waiting for the old copies ({len(left)}) to be deleted (a grace of a few seconds for reads sent to them)")
    deadline = time.monotonic() + timeout
    while left:
        left &= set(_named_in(namespace))
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(_LOOK_EVERY)
    return sorted(left)


def _named_in(namespace: str) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace]


def alive_nodes() -> list[str]:
    return sorted(str(n["NodeID"]) for n in ray.nodes() if n.get("Alive"))


def registry_of(namespace: str) -> Any:
    try:
        return ray.get_actor(REGISTRY_NAME, namespace=namespace)
    except ValueError:
        raise MoveFailed(f"no riqr runtime in Ray namespace {namespace!r}", namespace=namespace) from None


def _actor(namespace: str, uuid: str) -> Any:
    try:
        return ray.get_actor(uuid, namespace=namespace)
    except ValueError:
        raise MoveFailed(f"query actor {uuid} is not running", actor=uuid) from None


def _parts(partitions: Sequence[int]) -> str:
    return ", ".join(str(p) for p in partitions)


def _holds(namespace: str, m: Move, new: str) -> str:
    """What the move's new actor ``new`` holds of ``m.partitions`` now the switch is made, as the registry's
    table says: the partitions it answers for, and those it keeps a standby copy of (an actor `riqr
    standbys` added answers for none). Said plainly if the registry cannot be asked."""
    try:
        view: ClusterView = raycalls.get(registry_of(namespace).view.remote(), "registry view", timeout=_CALL_TIMEOUT)
        table = view.table(m.store)
    except RiqrError:
        table = None
    return f"holds partitions {_parts(m.partitions)}" if table is None else holdings_phrase(table, new, m.partitions)


def holdings_phrase(table: OwnershipTable, uuid: str, partitions: Sequence[int]) -> str:
    """'answers for partitions 0, 2' and/or 'keeps a standby copy of partitions 1, 3': ``uuid``'s role in
    ``table`` for each of ``partitions``."""
    answers = [p for p in partitions if table.partitions[p].active == uuid]
    standby = [p for p in partitions if p not in answers]
    said = [f"answers for partitions {_parts(answers)}"] if answers else []
    if standby:
        said.append(f"keeps a standby copy of partitions {_parts(standby)}")
    return " and ".join(said)


def describe(m: Move) -> str:
    """One line saying what ``m`` moves where (or, for a standby added, copies where)."""
    shared = " (no node without another copy of its partitions is left: two copies share it)" if m.shared else ""
    if m.standby:
        return (f"store {m.store}: a standby copy of partitions {_parts(m.partitions)} (those of query actor "
                f"{m.uuid}) on node {_node(m.target)}{shared}")  # fmt: skip
    return (f"store {m.store}: query actor {m.uuid} (partitions {_parts(m.partitions)}) from node "
            f"{_node(m.source)} to node {_node(m.target)}{shared}")  # fmt: skip


def _node(node_id: str) -> str:
    """A node id as `riqr status` and `ray status` show it: its first 12 characters."""
    return node_id[:12]

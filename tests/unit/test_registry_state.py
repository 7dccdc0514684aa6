import pytest

from runtime.errors import StoreConflict, StoreNotFound
from runtime.ownership import ActorInfo, Endpoint, plan_placement, table_from_placement
from runtime.registry import RegistryState
from tests.unit.fakes import kv_spec


def install(state: RegistryState, name: str = "s", partitions: int = 4) -> None:
    spec = kv_spec(name, partitions=partitions)
    plans = plan_placement(spec, ["n"])
    uuids = [f"{name}-{i}" for i in range(len(plans))]
    state.install(
        table_from_placement(spec, uuids, plans),
        [ActorInfo(u, name, "n", "10.0.0.1", p.partitions) for u, p in zip(uuids, plans)],
    )


def test_every_change_bumps_the_epoch_and_views_are_snapshots() -> None:
    state = RegistryState()
    before = state.view()
    install(state)
    assert state.epoch == 1
    assert before.tables == {} and set(state.view().tables) == {"s"}
    state.register_endpoint(Endpoint("n", "h", 1))
    assert state.epoch == 2
    state.register_endpoint(Endpoint("n", "h", 1))  # no change, no bump
    assert state.epoch == 2
    state.actor_moved("s-0", "m", "10.0.0.2")
    assert state.epoch == 3 and state.view().actors["s-0"].node_id == "m"
    assert state.view().actors["s-0"].incarnation == 3  # the epoch it was heard restarted at
    # Restarted on its own node: another incarnation all the same (it may have lost its data), a new epoch.
    state.actor_moved("s-0", "m", "10.0.0.2")
    assert state.epoch == 4 and state.view().actors["s-0"].incarnation == 4
    assert state.actor_moved("gone", "m", "10.0.0.2") == 4  # not an actor it lists: nothing changes
    # A restarted registry finds the actor again (incarnation 0 in what it reads) at epochs past the old
    # ones: its incarnation differs from every one handed out before, so a batch under way across the
    # registry's restart goes again to every copy (a replay each skips), never to none.
    before = state.view().actors["s-0"]
    restarted = RegistryState(epoch=10)
    install(restarted)
    assert restarted.view().actors["s-0"].incarnation == 11 != before.incarnation


def test_redeclaring_a_store_identically_is_fine_differently_is_a_conflict() -> None:
    state = RegistryState()
    install(state)
    assert state.existing(kv_spec("s")) is not None
    with pytest.raises(StoreConflict) as conflict:
        state.existing(kv_spec("s", partitions=8, key_type="int"))
    # What differs, in words, not the two whole definitions.
    assert conflict.value.message == (
        "store 's' already exists with another definition (key (key string) -> (key int); partitions 4 -> 8): "
        "its data cannot be kept; `riqr drop s` first, which deletes it, or use another name"
    )
    assert state.existing(kv_spec("other")) is None


def test_drop_returns_the_actors_to_stop() -> None:
    state = RegistryState()
    install(state, "a")
    install(state, "b")
    assert sorted(state.drop("a")) == ["a-0", "a-1"]
    assert set(state.view().actors) == {"b-0", "b-1"}
    with pytest.raises(StoreNotFound):
        state.drop("a")

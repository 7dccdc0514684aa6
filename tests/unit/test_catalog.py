import pytest

from runtime.catalog import StoreSpec, ValueField, validate_store_name
from runtime.errors import SchemaError
from runtime.keys import KeySchema


def spec(**kw: object) -> StoreSpec:
    args: dict = {
        "name": "order-count",
        "key": KeySchema("key", "string"),
        "value_fields": (ValueField("count", "bigint"),),
    }
    args.update(kw)
    return StoreSpec(**args)


def test_defaults_and_json() -> None:
    s = spec()
    assert (s.partitions, s.actors, s.standbys, s.kind) == (4, 2, None, "kv")  # standbys: decided at creation
    assert s.scalar_value
    assert s.to_json() == {
        "name": "order-count",
        "kind": "kv",
        "key": {"column": "key", "type": "string", "columns": [{"column": "key", "type": "string"}]},
        "value": [{"column": "count", "type": "bigint"}],
        "partitions": 4,
        "actors": 2,
        "standbys": None,
        "engine": "rocksdb",
        "read_replicas": False,
    }


def test_standbys_left_to_auto_are_one_on_a_multi_node_cluster_and_explicit_ones_stay() -> None:
    assert spec().with_standbys_for(2).standbys == 1
    assert spec().with_standbys_for(1).standbys == 0
    assert spec().with_standbys_for(0).standbys == 0  # nodes unknown: placement is left to Ray
    assert spec(actors=1).with_standbys_for(3).standbys == 0  # a standby needs another actor
    assert spec(standbys=0).with_standbys_for(3).standbys == 0
    assert spec(actors=3, standbys=2).with_standbys_for(2).standbys == 2


def test_standbys_a_store_is_declared_with_must_fit_its_actors_but_a_grown_store_is_a_valid_spec() -> None:
    with pytest.raises(SchemaError, match="2 standby copies of each partition need at least 3 actors"):
        spec(actors=2, standbys=2).with_standbys_for(3)
    with pytest.raises(SchemaError):
        spec(actors=1, standbys=1).placeable()
    # What the registry holds after `riqr standbys` gave a one-actor store a standby on a new actor.
    assert spec(actors=1, standbys=1).standbys == 1


@pytest.mark.parametrize(
    "kw",
    [
        {"name": "has space"},
        {"name": ""},
        {"name": "../x"},
        {"partitions": 0},
        {"actors": 0},
        {"actors": 5},
        {"standbys": -1},
        {"value_fields": ()},
        {"kind": "graph"},
    ],
)
def test_invalid_specs_are_rejected(kw: dict) -> None:
    with pytest.raises(SchemaError):
        spec(**kw)


def test_names() -> None:
    assert validate_store_name("customer-v1-changelog") == "customer-v1-changelog"
    with pytest.raises(Exception, match="store name"):
        validate_store_name("orders\n")  # "$" matched before a last newline


def test_same_layout_ignores_actor_count_but_not_partitions() -> None:
    assert spec().same_layout(spec(actors=4))
    assert not spec().same_layout(spec(partitions=8))
    assert not spec().same_layout(spec(key=KeySchema("key", "long")))

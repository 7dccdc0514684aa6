import io
import json

import pytest

from runtime import cli


def test_produce_writes_the_seed_records(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("sys.stdin", io.StringIO(cli.SEED_ORDERS + "\n"))
    assert cli.main(["produce", "order", "--home", str(tmp_path)]) == 0
    [path] = list((tmp_path / "data" / "order").iterdir())
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["1", "2", ""]


def test_produce_rejects_bad_input_and_writes_nothing(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("sys.stdin", io.StringIO("1--a\nno separator\n"))
    assert cli.main(["produce", "order", "--home", str(tmp_path)]) == 2
    assert "line 2" in capsys.readouterr().err
    assert not (tmp_path / "data" / "order").exists()


def test_produce_reads_riqr_home_from_the_environment(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RIQR_HOME", str(tmp_path))
    monkeypatch.setattr("sys.stdin", io.StringIO("k--v"))
    assert cli.main(["produce", "customer"]) == 0
    assert len(list((tmp_path / "data" / "customer").iterdir())) == 1


def test_seed_curls_cover_every_seed_path() -> None:
    curls = "\n".join(cli.seed_curls("http://localhost:7400"))
    for path in [
        "/metadata",
        "/metadata/stores/order-count",
        "/key/1",
        "/all",
        "/get/2",
        "range?from=1&to=5",
        "approximate-num-entries",
    ]:
        assert path in curls


def test_wait_until_returns_or_times_out() -> None:
    assert cli.wait_until(lambda: True, timeout=1, what="x") >= 0
    with pytest.raises(TimeoutError, match="never"):
        cli.wait_until(lambda: False, timeout=0.05, what="never", interval=0.01)

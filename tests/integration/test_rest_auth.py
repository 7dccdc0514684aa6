"""`riqr up` on a fresh namespace serves the REST API with auth on, over real HTTP; the token it prints
(the one the demo prints, minted the same way) and `riqr token` work; cursors page across nodes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from tests.integration.conftest import REPO, RayCluster
from tests.integration.helpers import http_get

pytestmark = pytest.mark.integration


def _riqr(*args: str) -> subprocess.CompletedProcess[str]:
    """The real command, as a separate Ray driver (this process is connected already)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("RIQR_JWT_SECRET", "RIQR_JWT_SECRET_FILE", "RIQR_JWT_PUBLIC_KEY_FILE", "RIQR_AUTH"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "riqr", *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def riqr_up(ray_cluster: RayCluster) -> Iterator[tuple[str, list[str], str]]:
    """A deployment by the real `riqr up` (read by its tests, never changed: one for the module)."""
    from verticles import deploy

    namespace = f"riqr-auth-{uuid.uuid4().hex[:8]}"
    done = _riqr("up", "--address", ray_cluster.address, "--namespace", namespace, "--port", "0")
    try:
        assert done.returncode == 0, done.stderr
        lines = done.stdout.split()
        urls = re.findall(r"REST API at (http://\S+)", done.stdout)  # not the console's URL on the same line
        token = lines[-1]
        assert len(urls) == 2 and token.count(".") == 2, done.stdout
        assert token not in done.stderr  # on stdout for the operator, never in the log stream
        # Whether this cluster runs Ray's token auth depends on the machine (a token file under ~/.ray turns
        # it on): riqr up warns exactly when it does not, as the cluster's own workers say.
        from riqr.access import ray_auth_mode

        mode = ray_auth_mode()
        assert mode in ("token", "disabled")
        assert ("without token authentication" in done.stderr) == (mode == "disabled"), done.stderr
        yield namespace, urls, token
    finally:
        deploy.down(namespace)


def test_riqr_up_has_auth_on_and_its_token_works(riqr_up: tuple[str, list[str], str]) -> None:
    namespace, urls, token = riqr_up
    for url in urls:
        assert url.startswith("http://127.0.0.1:")  # loopback unless --host says otherwise
        status, headers, body = http_get(f"{url}/stores")
        assert status == 401 and body["error"]["code"] == "unauthorized"
        assert headers["Server"] == "riqr"  # the worktree's code runs in the actors: no version banner
        status, _, body = http_get(f"{url}/stores", {"Authorization": f"Bearer {token}"})
        assert status == 200 and body == {"result": []}
        assert http_get(f"{url}/health")[0] == 200 and http_get(f"{url}/openapi.json")[0] == 200
        assert http_get(f"{url}/stores", {"Authorization": f"Bearer {token}x"})[0] == 401


def test_riqr_token_mints_tokens_the_deployment_accepts(
    riqr_up: tuple[str, list[str], str], ray_cluster: RayCluster
) -> None:
    namespace, urls, _ = riqr_up
    done = _riqr("token", "--address", ray_cluster.address, "--namespace", namespace, "--stores", "orders")
    assert done.returncode == 0, done.stderr
    # No store of that name yet (a typo reads nothing): said, and the token printed all the same.
    assert "riqr: note: no store 'orders' in namespace" in done.stderr and "(its stores: none yet)" in done.stderr
    narrow = {"Authorization": f"Bearer {done.stdout.strip()}"}
    assert http_get(f"{urls[0]}/stores", narrow)[0] == 200
    status, _, body = http_get(f"{urls[1]}/stores/other/all", narrow)
    assert status == 403 and body["error"]["code"] == "forbidden"


def test_riqr_up_again_with_auth_off_says_the_running_verticles_keep_theirs(
    riqr_up: tuple[str, list[str], str], ray_cluster: RayCluster
) -> None:
    """Ray's get_if_exists ignores a second `up`'s arguments: it must not report auth OFF (nor mint a
    token) for verticles that still check tokens, and must not pass as done."""
    namespace, urls, token = riqr_up
    done = _riqr("up", "--address", ray_cluster.address, "--namespace", namespace, "--port", "0", "--no-auth")
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("keeps its settings: REST auth on (asked: off)") == 2, done.stderr
    assert "authentication is OFF" not in done.stderr and "with the keys and settings" in done.stderr
    assert sorted(re.findall(r"REST API at (http://\S+)", done.stdout)) == sorted(urls)
    assert not [word for word in done.stdout.split() if word.count(".") == 2 and len(word) > 100]  # no token
    for url in urls:  # and they do check tokens still
        assert http_get(f"{url}/stores")[0] == 401
        assert http_get(f"{url}/stores", {"Authorization": f"Bearer {token}"})[0] == 200


def test_riqr_up_on_a_busy_port_says_why_and_a_retry_with_other_settings_works(ray_cluster: RayCluster) -> None:
    """The bind's reason reached the operator as "failed inside the actor: RuntimeError", and the HTTP
    verticle it left behind tried the same port again at the next `up`, whatever its --port said."""
    import socket

    from verticles import deploy

    namespace = f"riqr-busy-{uuid.uuid4().hex[:8]}"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        try:
            done = _riqr("up", "--address", ray_cluster.address, "--namespace", namespace, "--port", str(port))
            assert done.returncode == 2, done.stderr
            assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr, done.stderr
            assert "choose another --host or --port" in done.stderr and "Traceback" not in done.stderr
            again = _riqr("up", "--address", ray_cluster.address, "--namespace", namespace, "--port", "0", "--no-auth")
            assert again.returncode == 0, again.stderr
            urls = re.findall(r"REST API at (http://\S+)", again.stdout)
            assert len(urls) == 2 and all(not url.endswith(f":{port}") for url in urls), again.stdout
            assert all(http_get(f"{url}/stores")[0] == 200 for url in urls)  # the settings of this up, not the first
            # A token of the deployment's key is no use to a REST API that checks none: said, not printed.
            token = _riqr("token", "--address", ray_cluster.address, "--namespace", namespace)
            assert token.returncode == 2 and "checks no tokens" in token.stderr and not token.stdout, token.stderr
        finally:
            deploy.down(namespace)


def test_riqr_token_and_down_without_a_deployment_say_so(ray_cluster: RayCluster) -> None:
    absent = f"absent-{uuid.uuid4().hex[:8]}"
    done = _riqr("token", "--address", ray_cluster.address, "--namespace", absent)
    assert done.returncode == 2 and "not up" in done.stderr
    down = _riqr("down", "--address", ray_cluster.address, "--namespace", absent)  # a mistyped namespace
    assert down.returncode == 2 and f"riqr is not up in namespace '{absent}'" in down.stderr, down.stderr


def test_the_demo_token_and_curls_work(ray_cluster: RayCluster) -> None:
    import shlex

    from riqr.access import rest_auth, token_for
    from riqr.demo import seed_curls
    from runtime.config import RuntimeConfig
    from verticles import deploy

    namespace = f"riqr-demo-auth-{uuid.uuid4().hex[:8]}"
    try:
        auth = rest_auth(namespace, disabled=False)  # what run_demo does
        deployment = deploy.up(RuntimeConfig(namespace=namespace, http_port=0, advertise_host="127.0.0.1", auth=auth))
        base = deployment.endpoints[0].url
        token = token_for(auth)
        assert token is not None
        for command in seed_curls(base, token):
            words = shlex.split(command)
            if words[-1].endswith(("/metadata", "/stores")):
                name, _, value = words[2].partition(": ")
                assert http_get(words[-1], {name: value})[0] == 200, command
                assert http_get(words[-1])[0] == 401, command
    finally:
        deploy.down(namespace)


def test_a_cursor_from_one_node_pages_on_the_other(seeded) -> None:  # type: ignore[no-untyped-def]
    first, second = list(seeded.endpoints.values())
    status, _, page = http_get(f"{first}/stores/customer-v1-changelog/all?limit=3")
    assert status == 200 and page["next"]
    status, _, rest = http_get(f"{second}/stores/customer-v1-changelog/all?limit=10&cursor={page['next']}")
    assert status == 200, rest
    assert [e["key"] for e in page["result"] + rest["result"]] == list("1234567")


def test_riqr_up_for_a_node_without_a_rest_api_refuses_settings_the_running_ones_do_not_keep(
    ray_cluster: RayCluster,
) -> None:
    """A node that joined after the first `up` gets its verticles from the next one: with other auth (here
    off, the first up's on), they would serve beside nodes that check tokens. Refused before anything is
    created; with the first settings, the node joins."""
    import dataclasses

    from runtime.auth import AuthConfig, generate_secret
    from runtime.config import RuntimeConfig
    from runtime.errors import DeploymentConflict
    from verticles import deploy
    from verticles.http import http_name

    namespace = f"riqr-join-{uuid.uuid4().hex[:8]}"
    first, joined = ray_cluster.node_ids[:2]
    config = RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0, advertise_host="127.0.0.1",
                           auth=AuthConfig(enabled=True, secret=generate_secret()))  # fmt: skip
    try:
        assert len(deploy.up(config, nodes=[first]).endpoints) == 1
        with pytest.raises(DeploymentConflict, match=r"REST auth on \(asked: off\).*1 node\(s\) without one"):
            deploy.up(dataclasses.replace(config, auth=None), nodes=[first, joined])
        assert http_name(joined) not in deploy._named_in(namespace)  # nothing was created for it
        done = deploy.up(config, nodes=[first, joined])
        assert len(done.endpoints) == 2 and all(ep.kept == () and ep.auth != "off" for ep in done.endpoints)
        for ep in done.endpoints:
            assert http_get(f"http://{ep.host}:{ep.port}/stores")[0] == 401  # both check tokens
    finally:
        deploy.down(namespace)

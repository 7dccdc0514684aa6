"""cluster.yaml is a valid Ray cluster-launcher file (checked against Ray's own schema, no cluster started)."""

from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parents[2] / "cluster.yaml"


def test_cluster_yaml_passes_rays_schema() -> None:
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    validate_config(prepare_config(config))


def test_cluster_yaml_sets_riqr_up_on_every_node() -> None:
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    assert config["provider"]["type"] == "local"
    assert any("scripts/setup --runtime" in c for c in config["setup_commands"])  # no test tools on the nodes
    assert any("--head" in c for c in config["head_start_ray_commands"])
    assert any("RAY_HEAD_IP" in c for c in config["worker_start_ray_commands"])


def test_cluster_yaml_starts_ray_with_the_virtualenv_on_path() -> None:
    """A Ray job's entrypoint (`python -m topologies.food_orders`) is looked up on the PATH Ray started with."""
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = next(c for c in config[key] if "ray start" in c)
        assert 'export PATH="$HOME/riqr/.venv/bin:$PATH"' in start, start
        assert start.index("export PATH") < start.index("ray start"), start


def test_cluster_yaml_starts_every_node_with_rays_token_auth() -> None:
    """Ray's job API runs any code it is sent: no node of the shipped cluster starts Ray without token auth,
    and every node gets the one token (Ray's default path, copied from the launching machine)."""
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = next(c for c in config[key] if "ray start" in c)
        assert "export RAY_AUTH_MODE=token" in start, start
        assert start.index("RAY_AUTH_MODE=token") < start.index("ray start"), start


def test_cluster_yaml_makes_the_token_the_ssh_users_alone_on_every_node() -> None:
    """Ray writes ~/.ray/auth_token with the umask's mode and the mount keeps it: anyone who reads the token
    submits jobs. The setup (after the file mount) makes it 600, and never fails for its sake."""
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    setup = config["setup_commands"]
    chmod = next(c for c in setup if "chmod" in c)
    assert "chmod 700 ~/.ray" in chmod and "chmod 600 ~/.ray/auth_token" in chmod, chmod
    assert chmod.rstrip().endswith("|| true"), chmod  # a missing file must not stop the node's setup
    assert setup.index(chmod) < next(i for i, c in enumerate(setup) if "scripts/setup" in c)


def test_cluster_yaml_starts_ray_even_where_the_open_files_limit_is_lower() -> None:
    """`ulimit -n 65536 && ray start` never starts Ray where the hard limit is lower."""
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = next(c for c in config[key] if "ray start" in c)
        assert "ulimit -n 65536 &&" not in start, start
        assert '{ ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true; } && ray start' in start, start

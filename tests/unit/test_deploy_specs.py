"""The deployments of a pipeline config (deployments/specs.py), made by `specregen deploy`: one
`dataset/<NAME>` per dataset, whatever the names, and the shared ones; each entrypoint names a
real flow of that name."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from deployments.specs import config_parameter, deployment_specs
from flows.pipeline import DATASET_DEPLOYMENT
from specregen.config import load_config, parse_config
from tests.support import REPO


@pytest.mark.parametrize("name", ["pipeline.yaml", "demo.yaml", "demo-qwen3.yaml"])
def test_every_shipped_config_gets_a_deployment_per_dataset(name):
    config = load_config(REPO / "configs" / name)
    specs = deployment_specs(config, f"configs/{name}")
    names = [s.full_name for s in specs]
    assert len(names) == len(set(names))
    # The parent finds each dataset's deployment by this name (flows/pipeline.py).
    for dataset in config.datasets:
        assert DATASET_DEPLOYMENT.format(dataset=dataset.name) in names
    assert {"pipeline/nightly", "probe/probe", "batch-poll/batch-poll",
            "reconstruct-chunks/spread"} <= set(names)
    nightly = next(s for s in specs if s.full_name == "pipeline/nightly")
    assert nightly.cron == "0 3 * * *" and nightly.parameters == {
        "config_path": f"configs/{name}", "use_deployments": True}
    for spec in specs:
        path, function = spec.entrypoint.split(":")
        assert (REPO / path).is_file(), spec
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")),
                       function)
        assert flow.name == spec.flow, spec


def test_any_dataset_name_is_deployed_no_yaml_edited():
    config = parse_config({
        "storage": "out/x", "endpoint": {"base_url": "http://127.0.0.1:9/v1",
                                         "model": "moonshotai/kimi-k2.5"},
        "datasets": [{"name": "my-own_data", "adapter": "glaive",
                      "source": "bundled:B1_glaive"}]})
    specs = {s.full_name: s for s in deployment_specs(config, "/abs/my.yaml")}
    assert specs["dataset/my-own_data"].parameters == {"config_path": "/abs/my.yaml",
                                                       "dataset": "my-own_data"}


def test_the_config_is_named_relative_to_the_checkout_when_inside_it(tmp_path):
    assert config_parameter(REPO / "configs" / "pipeline.yaml", REPO) == "configs/pipeline.yaml"
    outside = tmp_path / "mine.yaml"
    assert config_parameter(outside, REPO) == str(outside.resolve())
    assert Path(config_parameter("configs/pipeline.yaml", Path.cwd())).parts[0] == "configs"

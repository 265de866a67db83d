"""config/prometheus/ checked by promtool: the rules parse and lint clean, the example scrape
config is valid, and the rules' unit tests (rules_test.yml) pass: each recording rule's value
and each alert both firing and not firing."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from tests.prometheus import PROMETHEUS_CONFIG, promtool


def test_rules_parse_and_lint_clean():
    promtool("check", "rules", "--lint=all", "--lint-fatal", PROMETHEUS_CONFIG / "rules.yml")


def test_rules_unit_tests_pass():
    result = promtool("test", "rules", "rules_test.yml", cwd=PROMETHEUS_CONFIG)
    assert "SUCCESS" in result.stdout


def test_example_scrape_config_is_valid(tmp_path: Path):
    # promtool stats the token file, which exists only in a deployment: check a copy whose
    # credentials_file points at a real file, with the rules next to it as in config/prometheus/
    config = yaml.safe_load((PROMETHEUS_CONFIG / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/services/cellscale/api/metrics"
    assert job["authorization"]["credentials_file"] == "/etc/prometheus/cellscale-token"
    token = tmp_path / "cellscale-token"
    token.write_text("a-token\n")
    job["authorization"]["credentials_file"] = str(token)
    shutil.copy(PROMETHEUS_CONFIG / "rules.yml", tmp_path / "rules.yml")
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(config))
    result = promtool("check", "config", copy)
    assert "SUCCESS: 1 rule files found" in result.stdout

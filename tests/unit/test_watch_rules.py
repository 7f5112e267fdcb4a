"""The shipped alert rules, checked and unit-tested by Prometheus's own promtool.

Every alert of agent/clockalign/watch/alerts.yml has test cases with synthetic series in
tests/data/watch/alerts_test.yml (firing and quiet); this test adds each expected alert's
annotations (its templates with the labels filled in), so promtool compares everything.
promtool comes from the Debian package prometheus (scripts/setup.sh installs it); where it
is absent the test skips saying so, and fails under CI.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from clockalign.errors import ClockalignError
from clockalign.watch import rules

DATA = Path(__file__).resolve().parents[1] / "data" / "watch"


def promtool():
    exe = shutil.which("promtool")
    if not exe:
        why = "promtool not installed (Debian package prometheus; scripts/setup.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return exe


def _fill(template: str, labels: dict) -> str:
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""),
                  template)


def with_annotations(tests: dict, rules_text: str) -> dict:
    by_name = {r["alert"]: r for g in yaml.safe_load(rules_text)["groups"] for r in g["rules"]
               if "alert" in r}
    for t in tests["tests"]:
        for case in t["alert_rule_test"]:
            rule = by_name[case["alertname"]]
            for a in case["exp_alerts"]:
                a["exp_annotations"] = {k: _fill(v, a["exp_labels"])
                                        for k, v in rule["annotations"].items()}
    return tests


def write_suite(tmp_path, rules_text):
    (tmp_path / "alerts.yml").write_text(rules_text)
    tests = with_annotations(yaml.safe_load((DATA / "alerts_test.yml").read_text()), rules_text)
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    return tmp_path / "alerts_test.yml"


def test_promtool_check_rules():
    p = subprocess.run([promtool(), "check", "rules",
                        str(rules.rules_text.__globals__["resources"].files("clockalign")
                            / "watch" / "alerts.yml")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(rules.alert_names())} rules found" in p.stdout


@pytest.mark.parametrize("factor", [rules.DEFAULT_P99_FACTOR, 2.5])
def test_promtool_test_rules_every_alert(tmp_path, factor):
    text = rules.render(factor)
    suite = write_suite(tmp_path, text)
    tested = {c["alertname"] for t in yaml.safe_load(suite.read_text())["tests"]
              for c in t["alert_rule_test"] if c["exp_alerts"]}
    assert tested == set(rules.alert_names(text)), "every alert needs a firing test case"
    p = subprocess.run([promtool(), "test", "rules", str(suite)], capture_output=True, text=True,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def test_a_broken_expectation_fails(tmp_path):
    """The harness can fail: the fragmentation alert expected with the wrong severity."""
    suite = write_suite(tmp_path, rules.render())
    broken = suite.read_text().replace("severity: critical", "severity: info", 1)
    suite.write_text(broken)
    p = subprocess.run([promtool(), "test", "rules", str(suite)], capture_output=True, text=True,
                       cwd=tmp_path)
    assert p.returncode != 0


def test_every_alert_has_for_severity_and_description():
    doc = yaml.safe_load(rules.rules_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) == len(rules.alert_names()) >= 10
    for r in alerts:
        assert "for" in r, r["alert"]
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert len(r["annotations"]["description"]) > 150, r["alert"]
        assert r["annotations"]["summary"]


def test_render_sets_the_p99_factor_only_there():
    text = rules.render(2.5)
    assert "> 2.5 * quantile_over_time" in text and "over 2.5x its own" in text
    assert text.replace("2.5", "3") == rules.render(3)
    assert rules.render() == rules.rules_text()
    with pytest.raises(ClockalignError, match="more than 1"):
        rules.render(0.5)


def test_the_context_lost_alert_names_every_sticky_cuda_result_and_no_other():
    """ClockalignCudaContextLost's result regex = timeline/codes.py's STICKY_CURESULTS."""
    from clockalign.timeline.codes import CURESULT_NAMES, STICKY_CURESULTS
    rule = next(r for g in yaml.safe_load(rules.render())["groups"] for r in g["rules"]
                if r["alert"] == "ClockalignCudaContextLost")
    regexes = set(re.findall(r'result=~"([^"]+)"', rule["expr"]))
    assert len(regexes) == 1
    sticky = regexes.pop()
    matched = {c for c, name in CURESULT_NAMES.items() if re.fullmatch(sticky, name)}
    assert matched == set(STICKY_CURESULTS)

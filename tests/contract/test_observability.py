"""The alert rules and the dashboard in deploy/observability/ against the code: every
expression parses as PromQL (promql-parser, the Rust parser's Python bindings: syntax and
types, e.g. rate() of an instant vector is refused), and every metric, label and label
value it names is one the services export, taken from their registry, so a renamed
metric or label fails here rather than silently in production. docs/observability.md
names exactly the metrics the code exports. Prometheus' promtool checks the same files
(scripts/deploy_check.py, also run here), and is shown to refuse broken ones."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import REGISTRY

# Importing the services' assembly registers every metric they define.
import services.console.app
import services.creation.app
import services.media.app
import services.notify.app  # noqa: F401
from scripts import deploy_check
from services.creation.domain import ReapDecision
from services.creation.gauges import READING as BACKLOG_READING
from services.creation.webhooks.deliverer import DISABLED_REASONS as WEBHOOK_DISABLED
from services.creation.webhooks.deliverer import OUTCOMES as WEBHOOK_OUTCOMES
from services.kit.jwks import FETCH_OUTCOMES
from services.notify.apns.rules import APPLE_REASONS, SENDER_REASONS
from services.notify.apns.sender import OUTCOMES

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "observability" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "observability" / "dashboard.json"
DOCS = ROOT / "docs" / "observability.md"

# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}
SEVERITIES = {"page", "ticket"}

# The values a label may take, from the code that sets them.
LABEL_VALUES: dict[str, set[str]] = {
    "decision": {d.value for d in ReapDecision},
    "reason": set(APPLE_REASONS) | set(SENDER_REASONS) | {"none", "other"} | set(WEBHOOK_DISABLED),
    "outcome": set(OUTCOMES) | set(FETCH_OUTCOMES) | set(WEBHOOK_OUTCOMES),
    "reading": {BACKLOG_READING},
    "why": {"taken_over", "abandoned"},
}


@dataclass(frozen=True)
class Exported:
    """One series name the services expose, with its label names."""

    name: str
    labels: frozenset[str]


# The sample names the text exposition writes for each kind of metric.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}
# The name the docs give each kind (what a reader looks for in a query).
DOCUMENTED_AS = {"counter": "_total", "gauge": "", "histogram": ""}


def collectors() -> Iterator[tuple[str, str, frozenset[str]]]:
    """Each metric in the registry: its name, kind and label names. prometheus_client
    keeps no public map from a collector to these."""
    for collector in REGISTRY._collector_to_names:
        kind = getattr(collector, "_type", None)
        if kind in SUFFIXES:
            yield collector._name, kind, frozenset(collector._labelnames)


def exported() -> dict[str, Exported]:
    """Every sample name the services expose, as the exposition writes it (a counter
    ``x`` as ``x_total``, a histogram as ``_bucket``, ``_count``, ``_sum``)."""
    found: dict[str, Exported] = {}
    for name, kind, labels in collectors():
        for suffix in SUFFIXES[kind]:
            with_le = labels | {"le"} if suffix == "_bucket" else labels
            found[name + suffix] = Exported(name + suffix, with_le)
    return found


EXPORTED = exported()


def selectors(expr: Any) -> Iterator[Any]:
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(expr, visit)
    yield from found


def grouping_labels(expr: Any) -> set[str]:
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            found.update(node.modifier.labels)

    promql_parser.walk(expr, visit)
    return found


def problems_of(expr_text: str) -> list[str]:
    """What is wrong with one expression: it does not parse, or it names a metric, a
    label or a label value the code does not export."""
    try:
        expr = promql_parser.parse(expr_text)
    except ValueError as error:
        return [f"does not parse: {error}"]
    problems: list[str] = []
    labels_in_use: set[str] = set(TARGET_LABELS)
    named = list(selectors(expr))
    if not named:
        problems.append("names no metric")
    for selector in named:
        metric = EXPORTED.get(selector.name)
        if metric is None:
            problems.append(f"{selector.name} is not exported")
            continue
        labels_in_use |= metric.labels
        for matcher in selector.matchers.matchers:
            if matcher.name not in metric.labels | TARGET_LABELS:
                problems.append(f"{selector.name} has no label {matcher.name}")
            known = LABEL_VALUES.get(matcher.name)
            if known is None:
                continue
            op = str(matcher.op)
            values = matcher.value.split("|") if op.endswith(("Re", "NotRe")) else [matcher.value]
            unknown = [v for v in values if v not in known]
            if unknown:
                problems.append(f"{selector.name}: {matcher.name} never takes {unknown}")
    for label in grouping_labels(expr) - labels_in_use:
        problems.append(f"groups by {label}, which no metric it reads carries")
    return problems


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_targets() -> list[tuple[str, str]]:
    document = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in document["panels"]
        for target in panel.get("targets", ())
    ]


# -- the checker itself ----------------------------------------------------------------


def test_the_checker_refuses_what_it_should() -> None:
    assert problems_of("max(atelier_jobs_needs_attention) > 0") == []
    assert problems_of("sum(rate(atelier_jobs_queued[5m]") != []  # syntax
    assert problems_of("rate(atelier_jobs_queued)") != []  # types
    assert problems_of("max(atelier_jobs_queued_total)") == [
        "atelier_jobs_queued_total is not exported"
    ]
    assert problems_of('atelier_reaper_decisions_total{decision="retried"}') != []
    assert problems_of('atelier_reaper_decisions_total{verdict="retry"}') != []
    assert problems_of("sum by (model) (atelier_jobs_queued)") != []


# -- alert rules -------------------------------------------------------------------------


def test_the_rule_file_is_well_formed() -> None:
    document = yaml.safe_load(RULES.read_text())
    groups = document["groups"]
    assert len({g["name"] for g in groups}) == len(groups), "group names must be unique"
    names = [r["alert"] for g in groups for r in g["rules"]]
    assert len(set(names)) == len(names), "alert names must be unique"
    for group in groups:
        assert set(group) <= {"name", "rules", "interval"}, group["name"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"Atelier[A-Za-z]+", rule["alert"]), rule["alert"]
            if "for" in rule:
                promql_parser.parse_duration(rule["for"])
            assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
            annotations = rule["annotations"]
            assert annotations["summary"] and annotations["description"], rule["alert"]
            page, _, anchor = annotations["runbook"].partition("#")
            assert (ROOT / page).is_file(), rule["alert"]
            assert anchor in doc_anchors(), f"{rule['alert']}: no section #{anchor}"


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_each_alert_reads_exported_metrics(rule: dict[str, Any]) -> None:
    assert problems_of(rule["expr"]) == []


# -- the dashboard -----------------------------------------------------------------------


def test_the_dashboard_is_well_formed() -> None:
    document = json.loads(DASHBOARD.read_text())
    assert document["uid"] and document["title"]
    ids = [panel["id"] for panel in document["panels"]]
    assert len(set(ids)) == len(ids), "panel ids must be unique"
    variables = {v["name"] for v in document["templating"]["list"]}
    for panel in document["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["targets"], panel
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        uid = panel["datasource"]["uid"]
        assert uid.startswith("${") and uid[2:-1] in variables, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs), panel["title"]


@pytest.mark.parametrize(("title", "expr"), dashboard_targets(), ids=lambda v: str(v)[:40])
def test_each_dashboard_query_reads_exported_metrics(title: str, expr: str) -> None:
    # Grafana's interval variable stands for a duration the parser needs spelled out.
    assert problems_of(expr.replace("$__rate_interval", "5m")) == []


def test_every_operator_metric_is_on_the_dashboard() -> None:
    shown = " ".join(expr for _, expr in dashboard_targets())
    for name in OPERATOR_METRICS:
        assert name in shown, f"{name} is not on the dashboard"


# -- the documentation ---------------------------------------------------------------------

# The operator figures: each must be exported, documented and on the dashboard.
OPERATOR_METRICS = (
    "atelier_jobs_queued",
    "atelier_jobs_queued_due",
    "atelier_jobs_oldest_queued_age_seconds",
    "atelier_jobs_needs_attention",
    "atelier_outbox_undelivered",
    "atelier_outbox_oldest_undelivered_age_seconds",
    "atelier_reaper_decisions_total",
    "atelier_reaper_last_sweep_timestamp_seconds",
    "atelier_worker_leases_lost_total",
    "atelier_notify_open_streams",
    "atelier_apns_pushes_total",
    "atelier_reading_ok",
    "atelier_reading_last_success_timestamp_seconds",
)


def doc_anchors() -> set[str]:
    """The anchors of the docs' headings, as GitHub derives them."""
    headings = re.findall(r"^#+ (.+)$", DOCS.read_text(), re.M)
    return {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in headings}


def test_the_docs_name_exactly_the_metrics_the_code_exports() -> None:
    ours = {
        name + DOCUMENTED_AS[kind] for name, kind, _ in collectors() if name.startswith("atelier_")
    }
    documented = set(re.findall(r"`(atelier_[a-z0-9_]+)", DOCS.read_text()))
    assert set(OPERATOR_METRICS) <= ours
    assert sorted(documented - ours) == [], "documented but not exported"
    assert sorted(ours - documented) == [], "exported but not documented"


# -- promtool: Prometheus' own checks ------------------------------------------------------
# `make promtool` puts it in the virtual environment (`make pytest` and `make deploy-check`
# depend on it); without it these fail, saying so.


def test_promtool_accepts_the_alert_rules() -> None:
    assert deploy_check.check_rules(RULES) == []


def test_the_alerts_pass_their_unit_tests() -> None:
    assert deploy_check.run_rule_tests(deploy_check.ALERT_TESTS) == []


def test_promtool_accepts_the_dashboard_queries() -> None:
    written = deploy_check.dashboard_rules(json.loads(DASHBOARD.read_text()))
    assert [r["expr"] for r in written["groups"][0]["rules"]] == [
        expr.replace("$__rate_interval", deploy_check.RATE_INTERVAL)
        for _, expr in dashboard_targets()
    ]
    assert deploy_check.check_dashboard(DASHBOARD) == []


def rule_file(tmp_path: Path, *rules: dict[str, Any]) -> Path:
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "broken", "rules": list(rules)}]}))
    return path


ALERT = {"alert": "AtelierBroken", "labels": {"severity": "ticket"}}


@pytest.mark.parametrize(
    ("rules", "said"),
    [
        ([{**ALERT, "expr": "sum(rate(atelier_rpc_total[5m])"}], "unclosed left parenthesis"),
        ([{**ALERT, "expr": "rate(atelier_jobs_queued) > 0"}], "expected type range vector"),
        ([{**ALERT, "expr": "max(atelier_jobs_queued) > 0", "for": "soon"}], "soon"),
        ([{**ALERT, "expr": "up"}, {**ALERT, "expr": "up"}], "duplicate"),
    ],
    ids=["syntax", "types", "duration", "duplicate-rule"],
)
def test_promtool_refuses_a_broken_rule(
    tmp_path: Path, rules: list[dict[str, Any]], said: str
) -> None:
    refused = deploy_check.check_rules(rule_file(tmp_path, *rules))
    assert refused, "promtool accepted a broken rule"
    assert said in "\n".join(refused)


def test_promtool_refuses_a_broken_dashboard_query(tmp_path: Path) -> None:
    document = json.loads(DASHBOARD.read_text())
    document["panels"][-1]["targets"][0]["expr"] = "histogram_quantile(0.95, sum by (le) ("
    broken = tmp_path / "dashboard.json"
    broken.write_text(json.dumps(document))
    assert deploy_check.check_dashboard(broken) != []


def test_promtool_fails_an_alert_test_whose_expectation_is_wrong(tmp_path: Path) -> None:
    """An alert expected to fire on series that should leave it silent: promtool test
    rules must refuse, or the unit tests above prove nothing."""
    wrong = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'atelier_jobs_needs_attention{instance="w1:9461"}', "values": "0x30"}
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "30m",
                        "alertname": "AtelierJobsNeedAttention",
                        "exp_alerts": [{"exp_labels": {"severity": "ticket"}}],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "wrong_test.yml"
    path.write_text(yaml.safe_dump(wrong))
    refused = deploy_check.run_rule_tests(path)
    assert refused and "FAILED" in "\n".join(refused)


def test_every_alert_has_unit_tests_that_fire_it_and_keep_it_silent() -> None:
    cases = [
        case
        for test in yaml.safe_load(deploy_check.ALERT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    for rule in rules():
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{rule['alert']} never fires"
        assert any(not case["exp_alerts"] for case in mine), f"{rule['alert']} never silent"

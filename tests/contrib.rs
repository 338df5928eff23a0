//! `contrib/`'s Grafana dashboard and Prometheus rules read only what the
//! library emits: every metric name is one of `lockwright::meter`'s (or a
//! summary's `_count`/`_sum` of one), and every label one the library sets.
//! promtool checks the rules, runs their tests (each alert fires on the
//! series it is for, and not on the others), and checks every dashboard
//! query as PromQL.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use lockwright::meter;

/// The labels the library sets, the summaries' `quantile`, and the two
/// Prometheus adds to every series it scrapes (`instance`, `job`).
const LABELS: &[&str] = &[
    "store",
    "primitive",
    "name",
    "outcome",
    "reason",
    "kind",
    "quantile",
    "instance",
    "job",
];

/// The labels every series carries (the library's and Prometheus').
const COMMON: &[&str] = &["store", "primitive", "name", "instance", "job"];

/// The quantiles metrics-exporter-prometheus renders by default.
const QUANTILES: &[&str] = &["0", "0.5", "0.9", "0.95", "0.99", "0.999", "1"];

/// The labels of `metric` beyond [`COMMON`].
fn own_labels(metric: &str) -> &'static [&'static str] {
    let base = SUMMARIES
        .iter()
        .find(|s| metric == format!("{s}_count") || metric == format!("{s}_sum"));
    match (metric, base) {
        (_, Some(&s)) if s == meter::ACQUIRE_WAIT => &["outcome"],
        (_, Some(_)) => &[],
        (m, None) if m == meter::ACQUIRE_WAIT => &["outcome", "quantile"],
        (m, None) if m == meter::HELD_TIME => &["quantile"],
        (m, None) if m == meter::RENEWALS => &["outcome"],
        (m, None) if m == meter::LOST => &["reason"],
        (m, None) if m == meter::STORE_ERRORS => &["kind"],
        _ => &[],
    }
}

/// The label values the library writes: the string literals of the files
/// that name them (`primitive`, `outcome`, `reason`, `kind`).
fn label_values() -> BTreeSet<String> {
    let core = Path::new(env!("CARGO_MANIFEST_DIR")).join("lock-core/src");
    let mut values = BTreeSet::new();
    for file in ["meter.rs", "watchdog.rs"] {
        let text = std::fs::read_to_string(core.join(file)).unwrap();
        for literal in text.split('"').skip(1).step_by(2) {
            if !literal.is_empty() && literal.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                values.insert(literal.to_owned());
            }
        }
    }
    values
}

/// The library's metric names.
const METRICS: &[&str] = &[
    meter::ACQUIRE_WAIT,
    meter::HELD_TIME,
    meter::HELD,
    meter::LEADER,
    meter::CONTENDED,
    meter::HANDOFFS,
    meter::RENEWALS,
    meter::LOST,
    meter::STORE_ERRORS,
];

/// The distributions, which the Prometheus exporter renders as summaries.
const SUMMARIES: &[&str] = &[meter::ACQUIRE_WAIT, meter::HELD_TIME];

fn contrib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib")
}

/// The `expr:` of every rule in a Prometheus rules file (one line, or a
/// `|` block), and the text of its annotations.
fn rule_exprs(text: &str) -> (Vec<String>, String) {
    let mut exprs = Vec::new();
    let mut annotations = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if let Some(expr) = trimmed.strip_prefix("expr:") {
            let expr = expr.trim();
            if ["|", "|-", ">", ">-"].contains(&expr) {
                let indent = line.len() - trimmed.len();
                let mut block = String::new();
                while let Some(next) = lines.peek() {
                    let next_indent = next.len() - next.trim_start().len();
                    if next.trim().is_empty() || next_indent <= indent {
                        break;
                    }
                    block.push_str(next.trim());
                    block.push('\n');
                    lines.next();
                }
                exprs.push(block);
            } else {
                exprs.push(expr.to_owned());
            }
        } else if trimmed.starts_with("summary:") || trimmed.starts_with("description:") {
            annotations.push_str(trimmed);
            annotations.push('\n');
        }
    }
    (exprs, annotations)
}

/// The dashboard's queries and legends, and its variables' queries.
fn dashboard_exprs(text: &str) -> (Vec<String>, String) {
    let dashboard: serde_json::Value = serde_json::from_str(text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    let mut legends = String::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push(target["expr"].as_str().expect("expr").to_owned());
            legends.push_str(target["legendFormat"].as_str().unwrap_or(""));
            legends.push('\n');
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(query) = variable["definition"].as_str() {
            exprs.push(query.to_owned());
        }
    }
    (exprs, legends)
}

/// The `lockwright_…` metric names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    expr.match_indices("lockwright_")
        .filter(|(at, _)| !ends_in_word(&expr[..*at]))
        .map(|(at, _)| {
            let tail = &expr[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            tail[..end].to_owned()
        })
        .collect()
}

/// Whether `text` ends inside a word (so what follows continues it).
fn ends_in_word(text: &str) -> bool {
    text.chars()
        .next_back()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One label matcher of a selector: its metric (empty for a bare
/// `{…}`), the label, the operator and the value.
struct Matcher {
    metric: String,
    label: String,
    op: String,
    value: String,
}

/// The matchers of every `{…}` selector in a PromQL expression.
fn matchers(expr: &str) -> Vec<Matcher> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(open) = rest.find('{') {
        let metric: String = rest[..open]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let close = rest[open..].find('}').expect("a closing brace") + open;
        for matcher in rest[open + 1..close].split(',') {
            let matcher = matcher.trim();
            let label: String = matcher
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let tail = matcher[label.len()..].trim_start();
            let op: String = tail.chars().take_while(|c| "=!~".contains(*c)).collect();
            let value = tail[op.len()..].trim().trim_matches('"').to_owned();
            if !label.is_empty() {
                found.push(Matcher {
                    metric: metric.clone(),
                    label,
                    op,
                    value,
                });
            }
        }
        rest = &rest[close + 1..];
    }
    found
}

/// The label names of every grouping or matching list: `by (…)`,
/// `without (…)`, `on (…)`, `ignoring (…)`, `group_left (…)`,
/// `group_right (…)`, with or without a space before the parenthesis.
fn grouping_labels(expr: &str) -> Vec<String> {
    let mut labels = Vec::new();
    for keyword in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        for (at, _) in expr.match_indices(keyword) {
            if ends_in_word(&expr[..at]) {
                continue; // inside another word
            }
            let after = expr[at + keyword.len()..].trim_start();
            let Some(list) = after.strip_prefix('(') else {
                continue;
            };
            let close = list.find(')').expect("a closing parenthesis");
            labels.extend(
                list[..close]
                    .split(',')
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty()),
            );
        }
    }
    labels
}

/// Checks every metric and label `exprs` and `templates` name.
fn check_names(file: &str, exprs: &[String], templates: &str, used: &mut BTreeSet<String>) {
    let values = label_values();
    for expr in exprs {
        for metric in metric_names(expr) {
            let base = SUMMARIES
                .iter()
                .find(|s| metric == format!("{s}_count") || metric == format!("{s}_sum"))
                .map_or(metric.as_str(), |s| s);
            assert!(
                METRICS.contains(&base),
                "{file}: {metric} is not a metric lockwright emits: {expr}"
            );
            used.insert(base.to_owned());
        }
        for label in grouping_labels(expr) {
            assert!(
                LABELS.contains(&label.as_str()),
                "{file}: the label {label:?} is not one lockwright sets: {expr}"
            );
        }
        for m in matchers(expr) {
            let own = own_labels(&m.metric);
            assert!(
                COMMON.contains(&m.label.as_str()) || own.contains(&m.label.as_str()),
                "{file}: the label {:?} is not one lockwright sets on {}: {expr}",
                m.label,
                m.metric
            );
            // Exact values must be ones the library writes (a regex, or a
            // Grafana variable, is the user's to choose).
            let exact = m.op == "=" || m.op == "!=";
            if exact && ["primitive", "outcome", "reason", "kind"].contains(&m.label.as_str()) {
                assert!(
                    values.contains(&m.value),
                    "{file}: {}=\"{}\" is not a value lockwright writes: {expr}",
                    m.label,
                    m.value
                );
            }
            if exact && m.label == "quantile" {
                assert!(
                    QUANTILES.contains(&m.value.as_str()),
                    "{file}: quantile {} is not one the exporter renders: {expr}",
                    m.value
                );
            }
        }
    }
    // Legends (`{{outcome}}`) and annotations (`{{ $labels.store }}`).
    for template in templates
        .split("{{")
        .skip(1)
        .filter_map(|t| t.split("}}").next())
    {
        let template = template.trim();
        let label = template
            .strip_prefix("$labels.")
            .or_else(|| template.strip_prefix(".Labels."))
            .unwrap_or(template);
        if label.starts_with('$') || label.starts_with('.') {
            continue; // `$value | humanize`, not a label.
        }
        assert!(
            LABELS.contains(&label),
            "{file}: the template {{{{{template}}}}} names a label lockwright does not set"
        );
    }
}

/// promtool, from scripts/test (`LOCKWRIGHT_TEST_PROMTOOL`) or the PATH.
fn promtool() -> PathBuf {
    // Where scripts/test unpacks it when the PATH has none.
    let unpacked = std::env::temp_dir().join("lockwright-test-servers/prometheus/usr/bin/promtool");
    let path = std::env::var_os("LOCKWRIGHT_TEST_PROMTOOL").map_or_else(
        || {
            if unpacked.exists() {
                unpacked
            } else {
                PathBuf::from("promtool")
            }
        },
        PathBuf::from,
    );
    let found = Command::new(&path).arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "promtool not found at {}: scripts/test unpacks it (LOCKWRIGHT_TEST_PROMTOOL)",
        path.display()
    );
    path
}

/// Runs promtool with `args` in `dir`; panics with its output on failure.
fn run_promtool(dir: &Path, args: &[&str]) {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool {}:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_dashboard_and_rules_name_only_what_the_library_emits() {
    let rules = std::fs::read_to_string(contrib().join("prometheus/lockwright.rules.yml")).unwrap();
    let dashboard = std::fs::read_to_string(contrib().join("grafana/lockwright.json")).unwrap();
    let (rule_exprs, annotations) = rule_exprs(&rules);
    assert_eq!(rule_exprs.len(), 4, "{rule_exprs:?}");
    let (panel_exprs, legends) = dashboard_exprs(&dashboard);
    let mut in_rules = BTreeSet::new();
    check_names("rules", &rule_exprs, &annotations, &mut in_rules);
    let mut on_dashboard = BTreeSet::new();
    check_names("dashboard", &panel_exprs, &legends, &mut on_dashboard);
    // Every metric the library emits has a panel.
    let all: BTreeSet<String> = METRICS.iter().map(|m| (*m).to_owned()).collect();
    assert_eq!(on_dashboard, all, "metrics without a panel");
}

/// The checker of names catches a name or a label the library does not
/// emit (so the test above can fail).
#[test]
fn the_name_check_catches_a_wrong_metric_or_label() {
    let mut used = BTreeSet::new();
    for (expr, why) in [
        ("rate(lockwright_lost[5m])", "is not a metric"),
        ("sum by (host) (lockwright_held)", "the label \"host\""),
        ("lockwright_held{pod=\"a\"}", "the label \"pod\""),
        (
            "lockwright_renewals_total{quantile=\"0.99\"}",
            "on lockwright_renewals_total",
        ),
        ("lockwright_acquire_wait_seconds_bucket", "is not a metric"),
        ("sum by(host) (lockwright_held)", "the label \"host\""),
        ("a * on(pod) group_left b", "the label \"pod\""),
        (
            "lockwright_held{outcome=\"acquired\"}",
            "on lockwright_held",
        ),
        ("lockwright_lost_total{reason!=\"closd\"}", "not a value"),
        (
            "lockwright_renewals_total{outcome=\"aquired\"}",
            "not a value",
        ),
        (
            "lockwright_acquire_wait_seconds{quantile=\"0.98\"}",
            "not one the exporter",
        ),
    ] {
        let caught = std::panic::catch_unwind(|| {
            check_names("test", &[expr.to_owned()], "", &mut BTreeSet::new());
        });
        let message = caught
            .expect_err(expr)
            .downcast::<String>()
            .map(|m| *m)
            .unwrap_or_default();
        assert!(message.contains(why), "{expr}: {message}");
    }
    for template in ["{{ $labels.host }}", "{{ .Labels.host }}", "{{host}}"] {
        let caught = std::panic::catch_unwind(|| {
            check_names("test", &[], template, &mut BTreeSet::new());
        });
        assert!(caught.is_err(), "{template}: an unknown label passed");
    }
    // And what is right passes.
    check_names(
        "test",
        &["sum by (store) (rate(lockwright_renewals_total{outcome=\"not_held\"}[5m]))".to_owned()],
        "{{ $labels.store }} {{outcome}}",
        &mut used,
    );
}

#[test]
fn promtool_checks_the_rules_and_their_tests_pass() {
    let dir = contrib().join("prometheus");
    run_promtool(&dir, &["check", "rules", "lockwright.rules.yml"]);
    run_promtool(&dir, &["test", "rules", "lockwright.rules.test.yml"]);
}

/// Each dashboard query, with Grafana's variables given values, is PromQL
/// promtool accepts (as a recording rule).
#[test]
fn every_dashboard_query_is_promql() {
    let dashboard = std::fs::read_to_string(contrib().join("grafana/lockwright.json")).unwrap();
    let (exprs, _) = dashboard_exprs(&dashboard);
    let mut file = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        if expr.starts_with("label_values(") {
            continue; // Grafana's own function, not PromQL.
        }
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$store", ".*");
        let quoted = serde_json::to_string(&expr).unwrap();
        file.push_str(&format!(
            "      - record: lockwright:panel_{i}\n        expr: {quoted}\n"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboard.rules.yml"), file).unwrap();
    run_promtool(dir.path(), &["check", "rules", "dashboard.rules.yml"]);
}

/// With `metrics-exporter-prometheus`' defaults (as in the leader-service
/// example), the distributions are rendered as the queries read them: a
/// summary, with a `quantile` series and `_count`.
#[tokio::test(flavor = "current_thread")]
async fn the_prometheus_exporter_renders_what_the_queries_read() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let text = {
        // This thread's recorder; the current-thread runtime keeps every
        // step of the lock on it.
        let _local = metrics::set_default_local_recorder(&recorder);
        let locker = lockwright::Locker::new(lockwright::backend::MemoryBackend::new());
        let guard = locker.lock("contrib-render").await.unwrap();
        guard.release().await.unwrap();
        handle.render()
    };
    for series in [
        format!("{}{{", meter::ACQUIRE_WAIT),
        format!("{}_count{{", meter::ACQUIRE_WAIT),
        format!("{}{{", meter::HELD_TIME),
    ] {
        assert!(text.contains(&series), "no {series} in:\n{text}");
    }
    assert!(
        text.contains("quantile=\"0.99\"") && text.contains("outcome=\"acquired\""),
        "{text}"
    );
    assert!(
        !text.contains("_bucket{"),
        "rendered as a histogram:\n{text}"
    );
}

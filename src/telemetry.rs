//! OpenTelemetry traces and GenAI client metrics: the OTLP exporters (spans
//! behind a `tracing` layer), off unless an OTLP endpoint is configured, and
//! the W3C `traceparent` of the current span for outbound requests.
//!
//! Attributes follow the OpenTelemetry semantic conventions (GenAI 1.37,
//! HTTP server spans); numbers are recorded as integers (`i64`), since the
//! `tracing` bridge turns a `u64` field into text. The bridge adds nothing
//! of its own (no thread, target, level or code location attributes).
//!
//! Only spans and events under [`TARGET`] (and the API's request spans)
//! are exported, so the service's log spans do not end up in the traces
//! and the span tree is the one the GenAI conventions describe. With the
//! exporter off no layer wants those callsites, so they cost a disabled
//! callsite check each.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, MeterProvider as _};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::DynFilterFn;
use tracing_subscriber::layer::Filter;
use uuid::Uuid;

/// The `tracing` target of every exported span and span event.
pub const TARGET: &str = "warden::otel";

/// The request spans of the API (src/http), exported as HTTP server spans.
const REQUEST_SPAN: (&str, &str) = ("warden::http", "request");

/// Most characters of a prompt or an answer recorded on a span when
/// `WARDEN_TRACE_CONTENT` is on.
pub const CONTENT_CAP_CHARS: usize = 16_384;

static ENABLED: AtomicBool = AtomicBool::new(false);
static CONTENT: AtomicBool = AtomicBool::new(false);

/// The GenAI client instruments, once the metrics exporter runs.
static GENAI_METRICS: OnceLock<GenAiMetrics> = OnceLock::new();

/// Bucket boundaries of `gen_ai.client.token.usage` the conventions advise.
const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// Bucket boundaries (seconds) of `gen_ai.client.operation.duration` the conventions advise.
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// The GenAI client histograms.
struct GenAiMetrics {
    tokens: Histogram<u64>,
    duration: Histogram<f64>,
}

/// How spans travel to the collector (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`).
    HttpProtobuf,
    /// OTLP/gRPC (`grpc`), plaintext.
    Grpc,
}

/// Where and how traces are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// The URL spans are sent to: the traces path itself for OTLP/HTTP,
    /// the collector's address for gRPC.
    pub endpoint: String,
    /// The URL metrics are sent to (the metrics path for OTLP/HTTP, the
    /// collector for gRPC); `None` exports no metrics.
    pub metrics_endpoint: Option<String>,
    /// The wire protocol.
    pub protocol: Protocol,
    /// `service.name`; `None` leaves it to `OTEL_RESOURCE_ATTRIBUTES`.
    pub service_name: Option<String>,
    /// Whether prompts and answers are recorded on the spans.
    pub content: bool,
}

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter refused its configuration.
    #[error("the OTLP trace exporter cannot start: {0}")]
    Exporter(String),
}

/// The running exporter; [`Telemetry::shutdown`] sends what is buffered.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
    meters: Option<SdkMeterProvider>,
}

impl Telemetry {
    /// Starts the OTLP exporter (its batch processor runs on a thread of
    /// its own) and turns on the `traceparent` of outbound requests.
    pub fn start(config: &TelemetryConfig) -> Result<Telemetry, TelemetryError> {
        let exporter = match config.protocol {
            Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(&config.endpoint)
                .build(),
            Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(&config.endpoint)
                .build(),
        }
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        // The builder reads OTEL_RESOURCE_ATTRIBUTES itself.
        let mut resource = Resource::builder();
        if let Some(name) = &config.service_name {
            resource = resource.with_service_name(name.clone());
        }
        let resource = resource.build();
        let meters = match &config.metrics_endpoint {
            Some(endpoint) => Some(start_metrics(config.protocol, endpoint, resource.clone())?),
            None => None,
        };
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_batch_exporter(exporter)
            .build();
        ENABLED.store(true, Ordering::Relaxed);
        CONTENT.store(config.content, Ordering::Relaxed);
        Ok(Telemetry { provider, meters })
    }

    /// The `tracing` layer that turns the exported spans into OTel spans.
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        // Nothing of the bridge's own: no thread.id / thread.name, target,
        // level, code.* location nor busy/idle times on the spans.
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("warden"))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_level(false)
            .with_tracked_inactivity(false)
            .with_filter(export_filter())
    }

    /// Sends the spans still buffered and stops the exporter (at shutdown).
    pub fn shutdown(self) {
        ENABLED.store(false, Ordering::Relaxed);
        if let Err(e) = self.provider.force_flush() {
            eprintln!("warden: flushing traces failed: {e}");
        }
        if let Err(e) = self.provider.shutdown() {
            eprintln!("warden: stopping the trace exporter failed: {e}");
        }
        if let Some(meters) = self.meters
            && let Err(e) = meters.shutdown()
        {
            eprintln!("warden: stopping the metrics exporter failed: {e}");
        }
    }
}

/// Starts the OTLP metrics exporter (a periodic reader, every
/// `OTEL_METRIC_EXPORT_INTERVAL`) and the GenAI client histograms.
fn start_metrics(
    protocol: Protocol,
    endpoint: &str,
    resource: Resource,
) -> Result<SdkMeterProvider, TelemetryError> {
    let exporter = match protocol {
        Protocol::HttpProtobuf => opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .build(),
        Protocol::Grpc => opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build(),
    }
    .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let provider = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_periodic_exporter(exporter)
        .build();
    let meter = provider.meter("warden");
    let tokens = meter
        .u64_histogram("gen_ai.client.token.usage")
        .with_unit("{token}")
        .with_description("Number of input and output tokens used.")
        .with_boundaries(TOKEN_BUCKETS.to_vec())
        .build();
    let duration = meter
        .f64_histogram("gen_ai.client.operation.duration")
        .with_unit("s")
        .with_description("GenAI operation duration.")
        .with_boundaries(DURATION_BUCKETS.to_vec())
        .build();
    let _ = GENAI_METRICS.set(GenAiMetrics { tokens, duration });
    Ok(provider)
}

/// What identifies a GenAI client operation in its metrics (and spans).
#[derive(Debug, Clone, Default)]
pub struct GenAiCall<'a> {
    /// `gen_ai.operation.name` (`chat`).
    pub operation: &'static str,
    /// `gen_ai.provider.name`.
    pub provider: &'static str,
    /// `gen_ai.request.model`.
    pub request_model: &'a str,
    /// `gen_ai.response.model`, when the server named it.
    pub response_model: Option<&'a str>,
    /// `server.address` and `server.port` of the model server.
    pub server: Option<(&'a str, u16)>,
}

impl GenAiCall<'_> {
    fn attributes(&self) -> Vec<KeyValue> {
        let mut out = vec![
            KeyValue::new("gen_ai.operation.name", self.operation),
            KeyValue::new("gen_ai.provider.name", self.provider),
            KeyValue::new("gen_ai.request.model", self.request_model.to_string()),
        ];
        if let Some(model) = self.response_model {
            out.push(KeyValue::new("gen_ai.response.model", model.to_string()));
        }
        if let Some((address, port)) = self.server {
            out.push(KeyValue::new("server.address", address.to_string()));
            out.push(KeyValue::new("server.port", i64::from(port)));
        }
        out
    }
}

/// Records one GenAI client operation in `gen_ai.client.operation.duration`
/// and, when it answered, its `(input, output)` tokens in
/// `gen_ai.client.token.usage`; `error` is its `error.type`.
pub fn record_genai_metrics(
    call: &GenAiCall<'_>,
    took: Duration,
    tokens: Option<(u64, u64)>,
    error: Option<&str>,
) {
    let Some(metrics) = GENAI_METRICS.get() else {
        return;
    };
    let mut attributes = call.attributes();
    if let Some((input, output)) = tokens {
        for (kind, count) in [("input", input), ("output", output)] {
            let mut attrs = attributes.clone();
            attrs.push(KeyValue::new("gen_ai.token.type", kind));
            metrics.tokens.record(count, &attrs);
        }
    }
    if let Some(error) = error {
        attributes.push(KeyValue::new("error.type", error.to_string()));
    }
    metrics.duration.record(took.as_secs_f64(), &attributes);
}

/// `n` as an attribute integer: OTLP integers are `i64`, and a `u64`
/// field would reach the exporter as text.
pub fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// The exporter's per-layer filter: [`exported`], with the callsites it
/// takes only `sometimes` interesting, never `always`. With `always` here and
/// from the log's filter, a callsite's spans skip the filtering pass and take
/// whatever per-layer state the thread holds: after an event every layer
/// disabled (tower-http's debug `on_response`), that state still says
/// "disabled", so every request after the first on a keep-alive connection
/// was dropped from the export (and from the log).
pub fn export_filter<S>() -> impl Filter<S> {
    DynFilterFn::new(
        |meta: &tracing::Metadata<'_>, _: &tracing_subscriber::layer::Context<'_, S>| {
            exported(meta)
        },
    )
    .with_callsite_filter(|meta| {
        if exported(meta) {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    })
}

/// Whether a span or event goes to the exporter.
pub fn exported(meta: &tracing::Metadata<'_>) -> bool {
    meta.target() == TARGET || (meta.target(), meta.name()) == REQUEST_SPAN
}

/// Whether traces are exported (cheap: one atomic load).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether prompts and answers go on the spans (`WARDEN_TRACE_CONTENT`).
pub fn content_enabled() -> bool {
    enabled() && CONTENT.load(Ordering::Relaxed)
}

/// `text` cut to [`CONTENT_CAP_CHARS`], for a content attribute.
pub fn capped(text: &str) -> String {
    match text.char_indices().nth(CONTENT_CAP_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// The header that carries a W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The W3C `traceparent` of the current span, when traces are exported.
pub fn traceparent() -> Option<String> {
    traceparent_of_span(&tracing::Span::current())
}

/// The W3C `traceparent` of `span`, when traces are exported.
pub fn traceparent_of_span(span: &tracing::Span) -> Option<String> {
    if !enabled() || span.is_disabled() {
        return None;
    }
    traceparent_of(&span.context())
}

/// Makes `span` a child of the caller's span named by `traceparent` (an
/// incoming request's header); an invalid one is ignored.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    if !enabled() || span.is_disabled() {
        return;
    }
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

fn traceparent_of(cx: &opentelemetry::Context) -> Option<String> {
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Who a session's agent is, for its `invoke_agent` span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentInfo {
    /// `gen_ai.agent.name`: the executor kind (`llm`, `webhook`, `worker`, `scripted`).
    pub name: String,
    /// `gen_ai.provider.name`: `openai` for the model executor (an
    /// OpenAI-compatible API), `warden` for agents Warden only supervises.
    pub provider: &'static str,
    /// `gen_ai.request.model`, when the agent is a model Warden calls.
    pub request_model: Option<String>,
}

/// The spans a run's `invoke_agent` span links to, as W3C traceparents
/// kept with the session (so a run on any replica links to them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunLinks {
    /// The request that created the session or last resumed it.
    pub request: Option<String>,
    /// The `invoke_agent` span of the session's previous run.
    pub previous_run: Option<String>,
}

/// The `invoke_agent {name}` span of one run of `session_id`: a trace of
/// its own, linked to the request that created or resumed the session and
/// to the previous run's span (whose trace id it also records).
pub fn agent_span(session_id: Uuid, agent: &AgentInfo, links: &RunLinks) -> tracing::Span {
    let span = tracing::info_span!(
        target: TARGET,
        "invoke_agent",
        otel.name = %format_args!("invoke_agent {}", agent.name),
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.provider.name = agent.provider,
        gen_ai.agent.name = agent.name.as_str(),
        gen_ai.agent.id = %session_id,
        gen_ai.conversation.id = %session_id,
        gen_ai.request.model = tracing::field::Empty,
        warden.session.exit.status = tracing::field::Empty,
        warden.session.exit.reason = tracing::field::Empty,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if !enabled() || span.is_disabled() {
        return span;
    }
    if let Some(model) = &agent.request_model {
        span.record("gen_ai.request.model", model.as_str());
    }
    link_run(&span, links);
    span
}

/// Links a run's `invoke_agent` span to `links` (before it is entered).
pub fn link_run(span: &tracing::Span, links: &RunLinks) {
    if !enabled() || span.is_disabled() {
        return;
    }
    if let Some(previous) = links.previous_run.as_deref().and_then(span_context) {
        span.set_attribute("warden.previous_trace_id", previous.trace_id().to_string());
        span.add_link(previous);
    }
    if let Some(request) = links.request.as_deref().and_then(span_context) {
        span.add_link(request);
    }
}

/// The span context a W3C `traceparent` names, when it is valid.
fn span_context(traceparent: &str) -> Option<SpanContext> {
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    let context = cx.span().span_context().clone();
    context.is_valid().then_some(context)
}

tokio::task_local! {
    /// The `traceparent` of the API request being served.
    static REQUEST_TRACEPARENT: Option<String>;
}

/// Runs `future` (an API request's handling) with `traceparent`, its
/// server span's, as [`request_traceparent`].
pub async fn with_request_traceparent<F: std::future::Future>(
    traceparent: Option<String>,
    future: F,
) -> F::Output {
    REQUEST_TRACEPARENT.scope(traceparent, future).await
}

/// The `traceparent` of the server span of the API request being served,
/// when traces are exported.
pub fn request_traceparent() -> Option<String> {
    REQUEST_TRACEPARENT
        .try_with(Clone::clone)
        .ok()
        .flatten()
        .filter(|_| enabled())
}

/// Adds a span event named `name` to the current span, its attributes
/// built only when traces are exported.
pub fn add_event(name: &'static str, attributes: impl FnOnce() -> Vec<KeyValue>) {
    if !enabled() {
        return;
    }
    let span = tracing::Span::current();
    if !span.is_disabled() {
        span.add_event(name, attributes());
    }
}

/// `value`'s fields as attributes named `prefix.field`: numbers, text and
/// booleans as they are, nested objects and lists as JSON text, nulls left out.
pub fn json_attributes(prefix: &str, value: &serde_json::Value) -> Vec<KeyValue> {
    let mut out = Vec::new();
    let mut push = |key: String, v: &serde_json::Value| {
        let value = match v {
            serde_json::Value::Null => return,
            serde_json::Value::Bool(b) => opentelemetry::Value::Bool(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => opentelemetry::Value::I64(i),
                None => opentelemetry::Value::F64(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => opentelemetry::Value::String(s.clone().into()),
            other => opentelemetry::Value::String(other.to_string().into()),
        };
        out.push(KeyValue::new(key, value));
    };
    match value {
        serde_json::Value::Object(fields) => {
            for (field, v) in fields {
                push(format!("{prefix}.{field}"), v);
            }
        }
        other => push(prefix.to_string(), other),
    }
    out
}

/// Records a list of strings (e.g. `gen_ai.response.finish_reasons`) on
/// `span`, which a `tracing` field cannot hold.
pub fn record_strings(span: &tracing::Span, key: &'static str, values: Vec<String>) {
    if enabled() && !span.is_disabled() {
        let values: Vec<opentelemetry::StringValue> = values.into_iter().map(Into::into).collect();
        span.set_attribute(key, opentelemetry::Value::Array(values.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    #[test]
    fn a_valid_context_gives_a_w3c_traceparent_and_an_empty_one_none() {
        let span = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let cx = opentelemetry::Context::new().with_remote_span_context(span);
        assert_eq!(
            traceparent_of(&cx).as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert_eq!(traceparent_of(&opentelemetry::Context::new()), None);
    }

    #[test]
    fn a_stored_traceparent_names_a_span_to_link_and_junk_none() {
        let context = span_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("a valid traceparent");
        assert_eq!(
            context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(context.span_id().to_string(), "00f067aa0ba902b7");
        for junk in [
            "",
            "junk",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        ] {
            assert!(span_context(junk).is_none(), "{junk}");
        }
    }

    #[test]
    fn counts_are_integers_saturating_at_i64_max() {
        assert_eq!(int(7u64), 7);
        assert_eq!(int(u64::MAX), i64::MAX);
        assert_eq!(int(3u32), 3);
    }

    #[test]
    fn outside_a_request_there_is_no_request_traceparent() {
        assert_eq!(request_traceparent(), None);
    }

    #[test]
    fn without_an_exporter_there_is_no_traceparent() {
        assert!(!enabled());
        assert_eq!(traceparent(), None);
    }

    #[test]
    fn json_fields_become_prefixed_attributes() {
        let attrs = json_attributes(
            "warden.gate",
            &serde_json::json!({ "rework_ratio": 0.25, "steps_since_start": 3, "coherence": null,
                "projection": { "tokens_to_finish": 10 }, "decision": "continue" }),
        );
        let find = |k: &str| {
            attrs
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| kv.value.clone())
        };
        assert_eq!(
            find("warden.gate.rework_ratio"),
            Some(opentelemetry::Value::F64(0.25))
        );
        assert_eq!(
            find("warden.gate.steps_since_start"),
            Some(opentelemetry::Value::I64(3))
        );
        assert_eq!(find("warden.gate.coherence"), None);
        assert_eq!(
            find("warden.gate.projection"),
            Some(opentelemetry::Value::String(
                "{\"tokens_to_finish\":10}".into()
            ))
        );
        assert_eq!(
            find("warden.gate.decision"),
            Some(opentelemetry::Value::String("continue".into()))
        );
        assert_eq!(json_attributes("x", &serde_json::json!(true)).len(), 1);
    }

    #[test]
    fn content_is_capped_on_a_character_boundary() {
        let long = "é".repeat(CONTENT_CAP_CHARS + 5);
        let cut = capped(&long);
        assert_eq!(cut.chars().count(), CONTENT_CAP_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(capped("short"), "short");
    }

    #[test]
    fn every_request_span_reaches_the_exporter_after_an_event_no_layer_wanted() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicUsize;
        use tracing_subscriber::layer::SubscriberExt;

        /// Counts the spans it is shown.
        struct Count(Arc<AtomicUsize>);
        impl<S: tracing::Subscriber> Layer<S> for Count {
            fn on_new_span(
                &self,
                _: &tracing::span::Attributes<'_>,
                _: &tracing::span::Id,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let (logged, sent) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        // As src/main.rs assembles them: the log with its level filter, the
        // exporter with its own.
        let subscriber = tracing_subscriber::registry()
            .with(Count(logged.clone()).with_filter(tracing_subscriber::EnvFilter::new("info")))
            .with(Some(Count(sent.clone()).with_filter(export_filter())));
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..3 {
                drop(tracing::info_span!(target: "warden::http", "request"));
                // What tower-http logs at the end of a request, below the log's level.
                tracing::debug!(target: "tower_http::trace::on_response", "finished");
            }
        });
        // The request span's callsite is never `always` for the exporter: it
        // is filtered every time, with the thread's state set afresh.
        let request = tracing_subscriber::registry().with(Count(Arc::default()));
        let meta = tracing::subscriber::with_default(request, || {
            tracing::info_span!(target: "warden::http", "request").metadata()
        })
        .expect("an enabled span has metadata");
        let interest =
            Filter::<tracing_subscriber::Registry>::callsite_enabled(&export_filter(), meta);
        assert!(interest.is_sometimes(), "{interest:?}");
        assert_eq!(
            sent.load(Ordering::SeqCst),
            3,
            "every request span exported"
        );
        assert_eq!(logged.load(Ordering::SeqCst), 3, "and logged");
    }

    #[test]
    fn only_the_otel_target_and_request_spans_are_exported() {
        struct Probe;
        impl tracing::Callsite for Probe {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &tracing::Metadata<'_> {
                unreachable!()
            }
        }
        let meta = |target: &'static str, name: &'static str| {
            tracing::Metadata::new(
                name,
                target,
                tracing::Level::INFO,
                None,
                None,
                None,
                tracing::field::FieldSet::new(&[], tracing::callsite::Identifier(&Probe)),
                tracing::metadata::Kind::SPAN,
            )
        };
        assert!(exported(&meta(TARGET, "invoke_agent")));
        assert!(exported(&meta("warden::http", "request")));
        assert!(!exported(&meta("warden::session::runner", "session")));
        assert!(!exported(&meta("warden::http", "other")));
    }
}

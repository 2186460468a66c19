//! `cargo run -p cpt-example-otel -- http://127.0.0.1:4317 [SPANS.jsonl] [REQUESTS]`
//! against `cpt serve --otlp-grpc 127.0.0.1:4317`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:4317".into());
    let spans = args.next().map(std::path::PathBuf::from);
    let requests = args.next().map_or(Ok(20), |n| n.parse())?;
    cpt_example_otel::run(&endpoint, spans.as_deref(), requests).await
}

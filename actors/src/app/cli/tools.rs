//! `hindsight tools list|call`: the tools of a configuration (simulated environments and MCP
//! servers), listed or called once through the resilient runner, printing the result or the
//! classified error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use hindsight::tools::{
    CallContext, CallOptions, TokioClock, ToolRunner, ToolSpec, Toolbox, ToolsConfig,
};

/// Arguments of `hindsight tools`.
#[derive(Debug, clap::Args)]
pub struct ToolsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ToolsCommand,
}

/// The `tools` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ToolsCommand {
    /// List the tools of the configuration.
    List {
        /// Configuration file with a `[tools]` table (default: the bundled bank-statements
        /// environment, `config/envs/bank_statements.toml`, when present).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print the tool specs as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Call one tool with JSON arguments and print its result or its classified error.
    Call {
        /// The tool's name (as listed).
        name: String,
        /// The arguments, a JSON object.
        json: String,
        /// Configuration file with a `[tools]` table.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The stage of the call (simulated tools serving several stages need it).
        #[arg(long, default_value = "")]
        stage: String,
        /// The task index (simulated tools draw from it).
        #[arg(long, default_value_t = 0)]
        task: u64,
        /// A task feature, `name=value` (repeatable).
        #[arg(long = "feature", value_parser = parse_feature)]
        features: Vec<(String, String)>,
        /// Print the whole call report (attempts, latency, cost) as JSON.
        #[arg(long)]
        report: bool,
        /// Call this many times and print latency percentiles (a quick round-trip measurement).
        #[arg(long, default_value_t = 1)]
        repeat: u32,
    },
}

fn parse_feature(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected name=value, found `{s}`"))
}

fn load_config(path: Option<&Path>) -> Result<ToolsConfig, String> {
    match path {
        Some(p) => hindsight::config::Config::load(Some(p))
            .map(|c| c.tools)
            .map_err(|e| e.to_string()),
        None => {
            let bundled = PathBuf::from("config/envs/bank_statements.toml");
            Ok(ToolsConfig {
                sim_envs: if bundled.exists() {
                    vec![bundled]
                } else {
                    Vec::new()
                },
                ..ToolsConfig::default()
            })
        }
    }
}

fn print_list(specs: &[ToolSpec], json: bool) -> Result<(), String> {
    if json {
        let text = serde_json::to_string_pretty(specs).map_err(|e| e.to_string())?;
        out(&text);
        return Ok(());
    }
    if specs.is_empty() {
        out("no tools configured");
        return Ok(());
    }
    let width = specs.iter().map(|s| s.name.len()).max().unwrap_or(4).max(4);
    out(&format!("{:width$}  IDEMPOTENT  DESCRIPTION", "NAME"));
    for s in specs {
        let description: String = s
            .description
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(100)
            .collect();
        out(&format!(
            "{:width$}  {:10}  {description}",
            s.name,
            if s.idempotent { "yes" } else { "no" }
        ));
    }
    Ok(())
}

/// Runs a `tools` subcommand; returns the process exit code (0 ok, 1 the tool failed, 2 bad
/// usage or configuration).
pub async fn run(args: ToolsArgs) -> i32 {
    match args.command {
        ToolsCommand::List { config, json } => {
            let cfg = match load_config(config.as_deref()) {
                Ok(c) => c,
                Err(e) => return usage_error(&e),
            };
            let toolbox = match Toolbox::build(&cfg).await {
                Ok(t) => t,
                Err(e) => return usage_error(&e.to_string()),
            };
            let code = match print_list(&toolbox.registry.specs(), json) {
                Ok(()) => 0,
                Err(e) => usage_error(&e),
            };
            toolbox.shutdown().await;
            code
        }
        ToolsCommand::Call {
            name,
            json,
            config,
            stage,
            task,
            features,
            report,
            repeat,
        } => {
            let args: serde_json::Value = match serde_json::from_str(&json) {
                Ok(v) => v,
                Err(e) => return usage_error(&format!("the arguments are not JSON: {e}")),
            };
            let cfg = match load_config(config.as_deref()) {
                Ok(c) => c,
                Err(e) => return usage_error(&e),
            };
            let toolbox = match Toolbox::build(&cfg).await {
                Ok(t) => t,
                Err(e) => return usage_error(&e.to_string()),
            };
            let (registry, servers, _envs) = toolbox.into_registry();
            let runner = ToolRunner::new(registry, Arc::new(TokioClock::new()), 0);
            let ctx = CallContext {
                run_id: "cli".into(),
                task_index: task,
                stage,
                features: features.into_iter().collect::<BTreeMap<_, _>>(),
                ..CallContext::default()
            };
            let mut samples = Vec::new();
            let mut last = None;
            for _ in 0..repeat.max(1) {
                let t = Instant::now();
                let r = runner
                    .call(&name, args.clone(), &ctx, &CallOptions::default())
                    .await;
                samples.push(t.elapsed().as_secs_f64() * 1000.0);
                last = Some(r);
            }
            for s in &servers {
                s.shutdown().await;
            }
            let Some(r) = last else { return 2 };
            if repeat > 1 {
                samples.sort_by(f64::total_cmp);
                let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
                eprintln!(
                    "{} calls: median {:.3} ms, p90 {:.3} ms, p99 {:.3} ms",
                    samples.len(),
                    pct(0.5),
                    pct(0.9),
                    pct(0.99)
                );
            }
            if report {
                match serde_json::to_string_pretty(&r) {
                    Ok(t) => out(&t),
                    Err(e) => return usage_error(&e.to_string()),
                }
            }
            match &r.result {
                Ok(output) => {
                    if !report {
                        let text = serde_json::to_string_pretty(&output.value).unwrap_or_default();
                        out(&text);
                    }
                    0
                }
                Err(e) => {
                    eprintln!(
                        "error: {} ({}): {}{}",
                        e.class,
                        e.category,
                        e.message,
                        e.retry_after_ms
                            .map(|ms| format!(" (retry after {ms} ms)"))
                            .unwrap_or_default()
                    );
                    1
                }
            }
        }
    }
}

/// Writes a line to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn out(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
}

fn usage_error(message: &str) -> i32 {
    eprintln!("error: {message}");
    2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_file(dir: &Path) -> PathBuf {
        let env = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/envs/bank_statements.toml");
        let path = dir.join("hindsight.toml");
        std::fs::write(
            &path,
            format!("[tools]\nsim_envs = [{:?}]\n", env.display().to_string()),
        )
        .unwrap();
        path
    }

    #[test]
    fn features_parse() {
        assert_eq!(parse_feature("a=b").unwrap(), ("a".into(), "b".into()));
        assert!(parse_feature("ab").is_err());
        assert!(parse_feature("=b").is_err());
    }

    #[tokio::test]
    async fn list_and_call_exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        let config = Some(config_file(dir.path()));
        let list = ToolsArgs {
            command: ToolsCommand::List {
                config: config.clone(),
                json: true,
            },
        };
        assert_eq!(run(list).await, 0);
        let call = |name: &str, json: &str, features: Vec<(String, String)>| ToolsArgs {
            command: ToolsCommand::Call {
                name: name.into(),
                json: json.into(),
                config: config.clone(),
                stage: "extract".into(),
                task: 0,
                features,
                report: false,
                repeat: 1,
            },
        };
        let pdf = vec![("filetype".to_string(), "pdf".to_string())];
        assert_eq!(
            run(call("pdfminer", r#"{"strategy": "direct"}"#, pdf)).await,
            0
        );
        // Task 0 with png: pdfminer is unfit (p_success 0.02) -> the tool failed.
        let png = vec![("filetype".to_string(), "png".to_string())];
        assert_eq!(
            run(call("pdfminer", r#"{"strategy": "direct"}"#, png)).await,
            1
        );
        assert_eq!(run(call("pdfminer", "not json", Vec::new())).await, 2);
        assert_eq!(run(call("nope", "{}", Vec::new())).await, 1);
        let missing = ToolsArgs {
            command: ToolsCommand::List {
                config: Some(dir.path().join("missing.toml")),
                json: false,
            },
        };
        assert_eq!(run(missing).await, 2);
    }
}

//! The command-line pieces of the daemon: `hindsight serve` options ([`ServeArgs`]) and the
//! `hindsight config` group: `hash-key` (the `key_sha256` of an API token), `show` (the effective
//! configuration as TOML) and `check` (validate a file and the environment).

use std::io::{BufRead, Write};
use std::path::PathBuf;

use hindsight::config::{Config, LogFormat, hash_key, key_from_arg};

/// `hindsight serve [--config FILE] [--listen ADDR] [--log-format text|json]`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The configuration file (default: $HINDSIGHT_CONFIG, else config/hindsight.toml if present).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Listen on this address instead of `api.listen`.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// `text` or `json` log lines instead of `log.format`.
    #[arg(long, value_name = "FORMAT", value_parser = crate::app::telemetry::parse_log_format)]
    pub log_format: Option<LogFormat>,
}

impl ServeArgs {
    /// The configuration: the file and the environment, then these options over them.
    pub fn load(&self) -> Result<Config, String> {
        let path = Config::locate(self.config.as_deref());
        let mut config = Config::load(path.as_deref()).map_err(|e| e.to_string())?;
        if let Some(listen) = &self.listen {
            listen
                .parse::<std::net::SocketAddr>()
                .map_err(|e| format!("--listen: not a socket address ({e}): `{listen}`"))?;
            config.api.listen = listen.clone();
        }
        if let Some(format) = self.log_format {
            config.log.format = format;
        }
        Ok(config)
    }
}

/// `hindsight config ...`.
#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// The `config` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ConfigCommand {
    /// Print the SHA-256 (hex) of an API token, for `key_sha256` in `[[api.tenants]]`.
    HashKey {
        /// The token; `-` reads it from the first line of stdin (keeps it out of shell history).
        token: String,
    },
    /// Print the effective configuration (file + HINDSIGHT_* overrides) as TOML.
    Show {
        /// The file (default: $HINDSIGHT_CONFIG, else config/hindsight.toml if present).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Check the configuration; prints `ok` and the file, or the key at fault and why.
    Check {
        /// The file (default: $HINDSIGHT_CONFIG, else config/hindsight.toml if present).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
}

/// Runs `hindsight config ...`, reading stdin from `input` and writing to `out`; an `Err` is one
/// sentence for stderr.
pub fn run_config(
    args: ConfigArgs,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Result<(), String> {
    let write = |out: &mut dyn Write, text: &str| {
        out.write_all(text.as_bytes())
            .map_err(|e| format!("cannot write to stdout: {e}"))
    };
    match args.command {
        ConfigCommand::HashKey { token } => {
            let token = key_from_arg(&token, input).map_err(|e| format!("reading stdin: {e}"))?;
            if token.is_empty() {
                return Err("the token is empty".to_string());
            }
            write(out, &format!("{}\n", hash_key(&token)))
        }
        ConfigCommand::Show { config } => {
            let path = Config::locate(config.as_deref());
            let cfg = Config::load(path.as_deref()).map_err(|e| e.to_string())?;
            let text = cfg.to_toml().map_err(|e| e.to_string())?;
            write(out, &text)
        }
        ConfigCommand::Check { config } => {
            let path = Config::locate(config.as_deref());
            Config::load(path.as_deref()).map_err(|e| e.to_string())?;
            let from = path.map_or("defaults".to_string(), |p| p.display().to_string());
            write(out, &format!("ok: {from}\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(command: ConfigCommand, stdin: &str) -> Result<String, String> {
        let mut out = Vec::new();
        run_config(
            ConfigArgs { command },
            &mut std::io::Cursor::new(stdin.as_bytes().to_vec()),
            &mut out,
        )?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn serve_args_override_the_file() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("h.toml");
        std::fs::write(&file, "[api]\nlisten = \"127.0.0.1:1\"\n").unwrap();
        let file_arg = file.display().to_string();
        let cli = Cli::try_parse_from([
            "x",
            "--config",
            file_arg.as_str(),
            "--listen",
            "127.0.0.1:2",
            "--log-format",
            "json",
        ])
        .unwrap();
        let config = cli.serve.load().unwrap();
        assert_eq!(config.api.listen, "127.0.0.1:2");
        assert_eq!(config.log.format, LogFormat::Json);
        assert!(Cli::try_parse_from(["x", "--log-format", "xml"]).is_err());
        let cli =
            Cli::try_parse_from(["x", "--config", file_arg.as_str(), "--listen", "nope"]).unwrap();
        assert!(cli.serve.load().unwrap_err().starts_with("--listen"));
    }

    #[test]
    fn hash_key_prints_the_digest() {
        let want = format!("{}\n", hash_key("tok"));
        assert_eq!(
            run(
                ConfigCommand::HashKey {
                    token: "tok".into()
                },
                ""
            ),
            Ok(want.clone())
        );
        assert_eq!(
            run(ConfigCommand::HashKey { token: "-".into() }, "tok\n"),
            Ok(want)
        );
        assert!(run(ConfigCommand::HashKey { token: "-".into() }, "").is_err());
    }

    #[test]
    fn check_and_show_name_the_key_at_fault() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[log]\nformat = \"xml\"\n").unwrap();
        let err = run(
            ConfigCommand::Check {
                config: Some(bad.clone()),
            },
            "",
        )
        .unwrap_err();
        assert!(err.contains("key `log.format`"), "{err}");
        let good = dir.path().join("good.toml");
        std::fs::write(&good, "[api]\nlisten = \"127.0.0.1:9999\"\n").unwrap();
        let ok = run(
            ConfigCommand::Check {
                config: Some(good.clone()),
            },
            "",
        )
        .unwrap();
        assert!(ok.starts_with("ok: "), "{ok}");
        let shown = run(ConfigCommand::Show { config: Some(good) }, "").unwrap();
        assert!(shown.contains("listen = \"127.0.0.1:9999\""), "{shown}");
    }
}

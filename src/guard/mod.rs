//! Guardrails: PII redaction ([`pii`]), multi-pass text sanitising ([`sanitize`](mod@sanitize)),
//! prompt-injection scanning ([`injection`]) and task ingress checks with budget ceilings and
//! permission scopes ([`ingress`]).

pub mod ingress;
pub mod injection;
pub mod pii;
pub mod sanitize;

pub use ingress::{Guard, GuardConfig, GuardError, RedactedTask};
pub use injection::{InjectionFinding, scan_injection};
pub use pii::{PiiKind, Redaction, redact};
pub use sanitize::{normalize, sanitize};

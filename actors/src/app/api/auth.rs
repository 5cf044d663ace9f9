//! Bearer-token authentication: tokens are hashed with SHA-256 and compared in constant time
//! against the configured `key_sha256` of each tenant; the request gets a [`Principal`].

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hindsight::config::TenantConfig;
use sha2::{Digest, Sha256};

use super::backend::Principal;
use super::error::ApiError;

/// A configured key that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("api.tenants[{index}].key_sha256: expected 64 hex digits")]
pub struct BadKey {
    /// Position in `api.tenants`.
    pub index: usize,
}

/// The tenants' key hashes, ready for comparison.
#[derive(Debug, Clone, Default)]
pub struct KeyTable {
    entries: Arc<Vec<([u8; 32], Principal)>>,
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

/// Equality of two digests without data-dependent early exit.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b.iter()) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

impl KeyTable {
    /// Builds the table from `api.tenants`.
    pub fn new(tenants: &[TenantConfig]) -> Result<KeyTable, BadKey> {
        let mut entries = Vec::with_capacity(tenants.len());
        for (index, t) in tenants.iter().enumerate() {
            let hash = unhex(&t.key_sha256.to_ascii_lowercase()).ok_or(BadKey { index })?;
            let principal = Principal {
                tenant: t.name.clone(),
                key_id: t.key_sha256.chars().take(16).collect(),
                policy_update: t.policy_update,
                policy_read: t.policy_update,
            };
            entries.push((hash, principal));
        }
        Ok(KeyTable {
            entries: Arc::new(entries),
        })
    }

    /// With `shared` (`api.shared_learning`), every key sees the statistics of the shared policy.
    pub fn sharing_learning(self, shared: bool) -> KeyTable {
        if !shared {
            return self;
        }
        let entries = self
            .entries
            .iter()
            .map(|(hash, p)| {
                let mut p = p.clone();
                p.policy_read = true;
                (*hash, p)
            })
            .collect();
        KeyTable {
            entries: Arc::new(entries),
        }
    }

    /// The principal a bearer token authenticates, if any. Every entry is compared.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let digest = Sha256::digest(token.as_bytes());
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&digest);
        let mut found = None;
        for (key, principal) in self.entries.iter() {
            if ct_eq(key, &hash) && found.is_none() {
                found = Some(principal.clone());
            }
        }
        found
    }
}

/// Middleware: 401 unless the `Authorization: Bearer TOKEN` header names a configured key; on
/// success the [`Principal`] is put in the request's extensions.
pub async fn require_key(State(keys): State<KeyTable>, mut req: Request, next: Next) -> Response {
    let mut given = req.headers().get_all(header::AUTHORIZATION).iter();
    let first = given.next();
    if given.next().is_some() {
        // Which of two keys the request is made with is not for the server to guess.
        return ApiError::field(
            StatusCode::UNAUTHORIZED,
            "authorization",
            "more than one `Authorization` header; send exactly one",
        )
        .into_response();
    }
    let header = match first {
        Some(h) => h,
        None => {
            return ApiError::field(
                StatusCode::UNAUTHORIZED,
                "authorization",
                "missing `Authorization: Bearer <key>` header",
            )
            .into_response();
        }
    };
    let token = header.to_str().ok().and_then(|v| {
        let (scheme, token) = v.trim().split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim().to_string())
    });
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return ApiError::field(
            StatusCode::UNAUTHORIZED,
            "authorization",
            "expected `Authorization: Bearer <key>`",
        )
        .into_response();
    };
    match keys.authenticate(&token) {
        Some(principal) => {
            req.extensions_mut().insert(principal);
            next.run(req).await
        }
        None => ApiError::field(StatusCode::UNAUTHORIZED, "authorization", "unknown API key")
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authenticates_by_hash() {
        let table = KeyTable::new(&[
            TenantConfig {
                policy_update: false,
                name: "a".into(),
                key_sha256: hindsight::config::hash_key("ka"),
            },
            TenantConfig {
                policy_update: false,
                name: "b".into(),
                key_sha256: hindsight::config::hash_key("kb"),
            },
        ])
        .unwrap();
        assert_eq!(table.authenticate("ka").unwrap().tenant, "a");
        assert_eq!(table.authenticate("kb").unwrap().tenant, "b");
        assert!(table.authenticate("kc").is_none());
        assert!(
            table
                .authenticate(&hindsight::config::hash_key("ka"))
                .is_none()
        );
        assert!(
            KeyTable::new(&[TenantConfig {
                policy_update: false,
                name: "a".into(),
                key_sha256: "zz".into()
            }])
            .is_err()
        );
    }
}

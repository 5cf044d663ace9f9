//! The tool layer's idempotency records, kept in the redb store: a call repeated with the same
//! key after it succeeded returns the recorded result, across actor and process restarts.

use hindsight::store::Store;
use hindsight::tools::{IdempotencyError, IdempotencyStore};
use serde_json::Value;

/// Idempotency records in the store's idempotency table.
#[derive(Clone)]
pub struct StoreIdempotency {
    store: Store,
}

impl StoreIdempotency {
    /// Records kept in `store`.
    pub fn new(store: Store) -> StoreIdempotency {
        StoreIdempotency { store }
    }
}

impl IdempotencyStore for StoreIdempotency {
    fn get<'a>(
        &'a self,
        key: &'a str,
    ) -> hindsight::tools::idempotency::IdempotencyFuture<'a, Option<Value>> {
        Box::pin(async move {
            self.store
                .get_idempotent(key)
                .map_err(|e| IdempotencyError(e.to_string()))
        })
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: &'a Value,
    ) -> hindsight::tools::idempotency::IdempotencyFuture<'a, ()> {
        Box::pin(async move {
            self.store
                .put_idempotent(key, value)
                .await
                .map_err(|e| IdempotencyError(e.to_string()))
        })
    }
}

//! A postcard-friendly, exact encoding of `serde_json::Value` (postcard cannot decode `Value`
//! itself, because `Value` needs a self-describing format).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

/// A JSON value in a form that postcard encodes and decodes exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum JsonTree {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    String(String),
    Array(Vec<JsonTree>),
    Object(Vec<(String, JsonTree)>),
}

impl From<&Value> for JsonTree {
    fn from(value: &Value) -> JsonTree {
        match value {
            Value::Null => JsonTree::Null,
            Value::Bool(b) => JsonTree::Bool(*b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    JsonTree::U64(u)
                } else if let Some(i) = n.as_i64() {
                    JsonTree::I64(i)
                } else {
                    JsonTree::F64(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => JsonTree::String(s.clone()),
            Value::Array(xs) => JsonTree::Array(xs.iter().map(JsonTree::from).collect()),
            Value::Object(m) => JsonTree::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), JsonTree::from(v)))
                    .collect(),
            ),
        }
    }
}

impl JsonTree {
    /// Back to a JSON value; fails only on a number JSON cannot hold (NaN or infinite).
    pub(crate) fn into_value(self) -> Result<Value, String> {
        Ok(match self {
            JsonTree::Null => Value::Null,
            JsonTree::Bool(b) => Value::Bool(b),
            JsonTree::U64(u) => Value::Number(u.into()),
            JsonTree::I64(i) => Value::Number(i.into()),
            JsonTree::F64(f) => Value::Number(
                Number::from_f64(f).ok_or_else(|| format!("the number {f} is not valid JSON"))?,
            ),
            JsonTree::String(s) => Value::String(s),
            JsonTree::Array(xs) => Value::Array(
                xs.into_iter()
                    .map(JsonTree::into_value)
                    .collect::<Result<_, _>>()?,
            ),
            JsonTree::Object(kvs) => {
                let mut m = Map::new();
                for (k, v) in kvs {
                    m.insert(k, v.into_value()?);
                }
                Value::Object(m)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kind_of_value_round_trips_through_postcard() {
        let v = json!({
            "null": null, "t": true, "u": 18446744073709551615u64, "i": -7,
            "f": 0.1, "s": "héllo", "a": [1, [2, {"x": []}]], "o": {}
        });
        let bytes = postcard::to_allocvec(&JsonTree::from(&v)).unwrap();
        let back: JsonTree = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.into_value().unwrap(), v);
    }

    #[test]
    fn a_nan_is_refused_not_panicked_on() {
        assert!(JsonTree::F64(f64::NAN).into_value().is_err());
    }
}

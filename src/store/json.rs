//! A postcard-friendly, exact encoding of `serde_json::Value` (postcard cannot decode `Value`
//! itself, because `Value` needs a self-describing format).

use serde::{Deserialize, Serialize, Serializer};
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
    /// A value kept as its JSON text, parsed when read: a run's checkpointed state as it was
    /// written before [`JsonTree::Encoded`] (read, no longer written).
    Text(String),
    /// A value kept as the postcard bytes of its tree, decoded when read: a run's checkpointed
    /// state, written straight from the run's progress ([`super::transcode`]) without building
    /// a value or its text first.
    Encoded(Vec<u8>),
}

/// A JSON value written exactly as its [`JsonTree`] would be, without building the tree (the
/// store's write path: a checkpoint or an experience is encoded straight from its values).
#[derive(Clone, Copy)]
pub(crate) struct JsonRef<'a>(pub(crate) &'a Value);

/// [`JsonTree`]'s name; [`JsonRef`] writes its variants' indices in declaration order, as the
/// derived `Serialize` does.
const NAME: &str = "JsonTree";

impl Serialize for JsonRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Null => s.serialize_unit_variant(NAME, 0, "Null"),
            Value::Bool(b) => s.serialize_newtype_variant(NAME, 1, "Bool", b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    s.serialize_newtype_variant(NAME, 2, "U64", &u)
                } else if let Some(i) = n.as_i64() {
                    s.serialize_newtype_variant(NAME, 3, "I64", &i)
                } else {
                    s.serialize_newtype_variant(NAME, 4, "F64", &n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(x) => s.serialize_newtype_variant(NAME, 5, "String", x),
            Value::Array(xs) => s.serialize_newtype_variant(NAME, 6, "Array", &Items(xs)),
            Value::Object(m) => s.serialize_newtype_variant(NAME, 7, "Object", &Entries(m)),
        }
    }
}

/// A tree's postcard bytes written as its [`JsonTree::Encoded`] would be.
#[derive(Clone, Copy)]
pub(crate) struct JsonEncoded<'a>(pub(crate) &'a [u8]);

impl Serialize for JsonEncoded<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_newtype_variant(NAME, 9, "Encoded", &Bytes(self.0))
    }
}

/// Bytes, as `Vec<u8>` is written (postcard writes both as a length and the bytes).
struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// An array's items, as `Vec<JsonTree>` is written.
struct Items<'a>(&'a [Value]);

impl Serialize for Items<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(JsonRef))
    }
}

/// An object's entries, as `Vec<(String, JsonTree)>` is written.
struct Entries<'a>(&'a Map<String, Value>);

impl Serialize for Entries<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(k, v)| (k, JsonRef(v))))
    }
}

impl JsonTree {
    /// Back to a JSON value; fails on a number JSON cannot hold (NaN or infinite) and on JSON
    /// text that does not parse.
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
            JsonTree::Text(t) => serde_json::from_str(&t)
                .map_err(|e| format!("the JSON text does not parse: {e}"))?,
            JsonTree::Encoded(bytes) => match postcard::from_bytes::<JsonTree>(&bytes) {
                // A tree holds no encoded tree: one inside would be a corrupt record's.
                Ok(JsonTree::Encoded(_)) => return Err("an encoded tree holds another".into()),
                Ok(tree) => tree.into_value()?,
                Err(e) => return Err(format!("the encoded tree does not decode: {e}")),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kind_of_value_written_from_its_reference_reads_back_as_a_tree() {
        let v = json!({
            "null": null, "t": true, "u": 18446744073709551615u64, "i": -7,
            "f": 0.1, "s": "héllo", "a": [1, [2, {"x": []}]], "o": {}
        });
        let bytes = postcard::to_allocvec(&JsonRef(&v)).unwrap();
        let back: JsonTree = postcard::from_bytes(&bytes).unwrap();
        // The same bytes as the tree itself writes.
        assert_eq!(postcard::to_allocvec(&back).unwrap(), bytes);
        assert_eq!(back.into_value().unwrap(), v);
    }

    #[test]
    fn json_text_reads_back_as_its_value_and_bad_text_is_refused() {
        let v = json!({"a": [1, 2.5, "x"], "b": {"c": null}});
        let text = serde_json::to_string(&v).unwrap();
        let bytes = postcard::to_allocvec(&JsonTree::Text(text.clone())).unwrap();
        let back: JsonTree = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, JsonTree::Text(text));
        assert_eq!(back.into_value().unwrap(), v);
        assert!(JsonTree::Text("{\"a\":".into()).into_value().is_err());
    }

    #[test]
    fn an_encoded_tree_reads_back_as_its_value_and_bad_bytes_are_refused() {
        let v = json!({"a": [1, 2.5, "x"], "b": {"c": null}});
        let inner = super::super::transcode::tree_bytes(&v).unwrap();
        let bytes = postcard::to_allocvec(&JsonEncoded(&inner)).unwrap();
        let back: JsonTree = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, JsonTree::Encoded(inner.clone()));
        assert_eq!(back.into_value().unwrap(), v);
        assert!(
            JsonTree::Encoded(inner[..inner.len() - 1].to_vec())
                .into_value()
                .is_err()
        );
        let nested = postcard::to_allocvec(&JsonTree::Encoded(inner)).unwrap();
        assert!(JsonTree::Encoded(nested).into_value().is_err());
    }

    #[test]
    fn a_nan_is_refused_not_panicked_on() {
        assert!(JsonTree::F64(f64::NAN).into_value().is_err());
    }
}

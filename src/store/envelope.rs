//! The record envelope: every stored value is one format-version byte followed by postcard.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The format version written by this build.
pub const VERSION: u8 = 1;

/// Why bytes could not be turned into a record or back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// The value has no bytes at all, so not even a version byte.
    #[error("the envelope is empty (no version byte)")]
    Empty,
    /// The version byte is not one this build can read.
    #[error("unknown format version {found} (this build reads version {VERSION})")]
    UnknownVersion {
        /// The version byte found.
        found: u8,
    },
    /// The postcard body does not decode as the expected record.
    #[error("the body does not decode: {0}")]
    Body(String),
    /// The body decoded but bytes were left over, so it was not the expected record.
    #[error("{0} bytes left over after the record")]
    TrailingBytes(usize),
    /// The record could not be encoded.
    #[error("the record cannot be encoded: {0}")]
    Encode(String),
}

/// A field stored as JSON text inside a postcard record (`#[serde(with = "as_json")]`), for
/// settings structs: postcard is not self-describing, so a setting added to the struct would
/// make every stored record that embeds it undecodable, while JSON text with `#[serde(default)]`
/// on the struct reads older records (missing settings take their defaults) and newer ones
/// (unknown settings are ignored).
pub mod as_json {
    use serde::de::{DeserializeOwned, Error as _};
    use serde::ser::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes `value` as a JSON string.
    pub fn serialize<T: Serialize, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        let text = serde_json::to_string(value).map_err(S::Error::custom)?;
        s.serialize_str(&text)
    }

    /// Reads a value from a JSON string.
    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map_err(D::Error::custom)
    }
}

/// Encodes `value` as an envelope: [`VERSION`] then postcard.
/// The buffer is sized by a first counting pass, so that the bytes are written once: growing it
/// from one byte took a quarter of a store caller's time under 64 concurrent writers.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EnvelopeError> {
    let encode_err = |e: postcard::Error| EnvelopeError::Encode(e.to_string());
    let size = postcard::experimental::serialized_size(value).map_err(encode_err)?;
    let mut out = Vec::with_capacity(1 + size);
    out.push(VERSION);
    postcard::to_extend(value, out).map_err(encode_err)
}

/// Decodes an envelope written by [`encode`], checking the version and that every byte is used.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, EnvelopeError> {
    let (&version, body) = bytes.split_first().ok_or(EnvelopeError::Empty)?;
    if version != VERSION {
        return Err(EnvelopeError::UnknownVersion { found: version });
    }
    let (value, rest) =
        postcard::take_from_bytes::<T>(body).map_err(|e| EnvelopeError::Body(e.to_string()))?;
    if !rest.is_empty() {
        return Err(EnvelopeError::TrailingBytes(rest.len()));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Rec {
        name: String,
        n: u64,
        xs: Vec<f64>,
    }

    fn rec() -> Rec {
        Rec {
            name: "alpha".into(),
            n: 42,
            xs: vec![0.5, -1.25],
        }
    }

    #[test]
    fn round_trip_starts_with_the_version_byte() {
        let bytes = encode(&rec()).unwrap();
        assert_eq!(bytes[0], VERSION);
        assert_eq!(decode::<Rec>(&bytes).unwrap(), rec());
    }

    #[test]
    fn the_buffer_is_sized_once() {
        let bytes = encode(&rec()).unwrap();
        assert_eq!(bytes.capacity(), bytes.len());
    }

    #[test]
    fn empty_bytes_are_rejected() {
        assert_eq!(decode::<Rec>(&[]), Err(EnvelopeError::Empty));
    }

    #[test]
    fn a_wrong_version_is_rejected() {
        let mut bytes = encode(&rec()).unwrap();
        bytes[0] = 9;
        assert_eq!(
            decode::<Rec>(&bytes),
            Err(EnvelopeError::UnknownVersion { found: 9 })
        );
    }

    #[test]
    fn a_truncated_body_is_rejected() {
        let bytes = encode(&rec()).unwrap();
        let err = decode::<Rec>(&bytes[..bytes.len() - 3]).unwrap_err();
        assert!(matches!(err, EnvelopeError::Body(_)), "{err:?}");
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode(&rec()).unwrap();
        bytes.extend_from_slice(&[1, 2]);
        assert_eq!(decode::<Rec>(&bytes), Err(EnvelopeError::TrailingBytes(2)));
    }

    #[test]
    fn a_settings_field_stored_as_json_reads_across_added_and_removed_settings() {
        use serde::{Deserialize, Serialize};
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        #[serde(default)]
        struct OldSettings {
            limit: u32,
        }
        impl Default for OldSettings {
            fn default() -> Self {
                OldSettings { limit: 5 }
            }
        }
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        #[serde(default)]
        struct NewSettings {
            limit: u32,
            window_ms: u64,
        }
        impl Default for NewSettings {
            fn default() -> Self {
                NewSettings {
                    limit: 5,
                    window_ms: 60_000,
                }
            }
        }
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Old {
            #[serde(with = "as_json")]
            settings: OldSettings,
            evidence: Vec<u64>,
        }
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct New {
            #[serde(with = "as_json")]
            settings: NewSettings,
            evidence: Vec<u64>,
        }
        // Written by an older build, read by a newer one: the new setting takes its default.
        let old = Old {
            settings: OldSettings { limit: 9 },
            evidence: vec![1, 2, 3],
        };
        let new: New = decode(&encode(&old).unwrap()).unwrap();
        assert_eq!(new.settings.limit, 9);
        assert_eq!(new.settings.window_ms, 60_000);
        assert_eq!(new.evidence, [1, 2, 3]);
        // And back: an older build ignores the setting it does not know.
        let back: Old = decode(&encode(&new).unwrap()).unwrap();
        assert_eq!(back, old);
    }
}

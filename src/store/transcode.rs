//! transcode: writes any serializable value straight into the stored form of the JSON value it
//! serializes to (the postcard bytes of its [`JsonTree`](super::json::JsonTree)), without building the value or its
//! JSON text: what a run's checkpointed progress is written as.
//!
//! The bytes decode as the `JsonTree` of `serde_json::to_value` of the same value: a struct or
//! a map is an object, a sequence or a tuple an array, a unit variant its name, a non-finite
//! float `null`, a map key its string (a number or a bool as its text), as serde_json has them.

use std::fmt;

use serde::Serialize;
use serde::ser::{self, Impossible};

/// Why a value has no JSON form (a map key that is not a string, number or unit variant; a
/// 128-bit integer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TranscodeError(String);

impl fmt::Display for TranscodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TranscodeError {}

impl ser::Error for TranscodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        TranscodeError(msg.to_string())
    }
}

/// The postcard bytes of the [`JsonTree`](super::json::JsonTree) of `value`'s JSON form.
pub(crate) fn tree_bytes<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, TranscodeError> {
    let mut w = TreeWriter { out: Vec::new() };
    value.serialize(&mut w)?;
    Ok(w.out)
}

/// `JsonTree`'s variant indices, as postcard writes them.
const NULL: u8 = 0;
const BOOL: u8 = 1;
const U64: u8 = 2;
const I64: u8 = 3;
const F64: u8 = 4;
const STRING: u8 = 5;
const ARRAY: u8 = 6;
const OBJECT: u8 = 7;

/// `Serializer` methods writing integers as the `JsonTree` number they widen to.
macro_rules! numbers {
    ($($as:ident: $($method:ident($ty:ty)),*);*) => {$($(
        fn $method(self, v: $ty) -> Result<(), TranscodeError> {
            self.$as(v.into());
            Ok(())
        }
    )*)*};
}

/// `Serializer` methods writing an integer map key as its decimal text.
macro_rules! key_numbers {
    ($($method:ident($ty:ty)),*) => {$(
        fn $method(self, v: $ty) -> Result<(), TranscodeError> {
            self.text(&v.to_string())
        }
    )*};
}

/// Writes values as postcard writes their `JsonTree`.
struct TreeWriter {
    out: Vec<u8>,
}

impl TreeWriter {
    fn varint(&mut self, mut x: u64) {
        while x >= 0x80 {
            self.out.push((x as u8) | 0x80);
            x >>= 7;
        }
        self.out.push(x as u8);
    }

    fn str_bytes(&mut self, s: &str) {
        self.varint(s.len() as u64);
        self.out.extend_from_slice(s.as_bytes());
    }

    fn u64(&mut self, x: u64) {
        self.out.push(U64);
        self.varint(x);
    }

    fn i64(&mut self, x: i64) {
        match u64::try_from(x) {
            Ok(u) => self.u64(u),
            Err(_) => {
                self.out.push(I64);
                self.varint(((x << 1) ^ (x >> 63)) as u64);
            }
        }
    }

    fn f64(&mut self, x: f64) {
        if x.is_finite() {
            self.out.push(F64);
            self.out.extend_from_slice(&x.to_le_bytes());
        } else {
            self.out.push(NULL);
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push(STRING);
        self.str_bytes(s);
    }

    /// Starts an array or an object of `len` items (a guess when not given: fixed at its end).
    fn open(&mut self, tag: u8, len: Option<usize>) -> Compound<'_> {
        self.out.push(tag);
        let at = self.out.len();
        let declared = len.unwrap_or(0);
        self.varint(declared as u64);
        let header = self.out.len() - at;
        Compound {
            w: self,
            at,
            header,
            declared,
            count: 0,
        }
    }

    /// Starts `{variant: ...}` (an enum's newtype, tuple or struct variant).
    fn open_variant(&mut self, variant: &str) {
        self.out.push(OBJECT);
        self.varint(1);
        self.str_bytes(variant);
    }
}

/// An array or object being written: its item count is fixed when it ends.
struct Compound<'a> {
    w: &'a mut TreeWriter,
    /// Where its count starts, how many bytes it takes, and what it says.
    at: usize,
    header: usize,
    declared: usize,
    count: usize,
}

impl Compound<'_> {
    fn item<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), TranscodeError> {
        self.count += 1;
        value.serialize(&mut *self.w)
    }

    fn entry<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> Result<(), TranscodeError> {
        self.count += 1;
        self.w.str_bytes(key);
        value.serialize(&mut *self.w)
    }

    fn close(self) -> Result<(), TranscodeError> {
        if self.count != self.declared {
            let mut count = TreeWriter { out: Vec::new() };
            count.varint(self.count as u64);
            self.w.out.splice(self.at..self.at + self.header, count.out);
        }
        Ok(())
    }
}

impl<'a> ser::Serializer for &'a mut TreeWriter {
    type Ok = ();
    type Error = TranscodeError;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = MapWriter<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), TranscodeError> {
        self.out.extend_from_slice(&[BOOL, u8::from(v)]);
        Ok(())
    }
    numbers!(
        i64: serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64);
        u64: serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64)
    );
    fn serialize_f32(self, v: f32) -> Result<(), TranscodeError> {
        self.f64(v.into());
        Ok(())
    }
    fn serialize_f64(self, v: f64) -> Result<(), TranscodeError> {
        self.f64(v);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), TranscodeError> {
        self.string(v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), TranscodeError> {
        self.string(v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), TranscodeError> {
        let mut seq = self.open(ARRAY, Some(v.len()));
        for b in v {
            seq.item(b)?;
        }
        seq.close()
    }
    fn serialize_none(self) -> Result<(), TranscodeError> {
        self.out.push(NULL);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), TranscodeError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), TranscodeError> {
        self.out.push(NULL);
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), TranscodeError> {
        self.out.push(NULL);
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), TranscodeError> {
        self.string(variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), TranscodeError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), TranscodeError> {
        self.open_variant(variant);
        value.serialize(self)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Compound<'a>, TranscodeError> {
        Ok(self.open(ARRAY, len))
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>, TranscodeError> {
        Ok(self.open(ARRAY, Some(len)))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, TranscodeError> {
        Ok(self.open(ARRAY, Some(len)))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, TranscodeError> {
        self.open_variant(variant);
        Ok(self.open(ARRAY, Some(len)))
    }
    fn serialize_map(self, len: Option<usize>) -> Result<MapWriter<'a>, TranscodeError> {
        Ok(MapWriter {
            c: self.open(OBJECT, len),
        })
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Compound<'a>, TranscodeError> {
        Ok(self.open(OBJECT, Some(len)))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, TranscodeError> {
        self.open_variant(variant);
        Ok(self.open(OBJECT, Some(len)))
    }
    fn serialize_i128(self, v: i128) -> Result<(), TranscodeError> {
        match i64::try_from(v) {
            Ok(v) => self.i64(v),
            Err(_) => match u64::try_from(v) {
                Ok(u) => self.u64(u),
                Err(_) => return Err(TranscodeError(format!("{v} does not fit a JSON number"))),
            },
        }
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), TranscodeError> {
        let u = u64::try_from(v)
            .map_err(|_| TranscodeError(format!("{v} does not fit a JSON number")))?;
        self.u64(u);
        Ok(())
    }
}

/// The compound serializers whose every element is an array's item.
macro_rules! items {
    ($($part:ident :: $method:ident),*) => {$(
        impl ser::$part for Compound<'_> {
            type Ok = ();
            type Error = TranscodeError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), TranscodeError> {
                self.item(value)
            }
            fn end(self) -> Result<(), TranscodeError> {
                self.close()
            }
        }
    )*};
}

items!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// The compound serializers whose every element is an object's field.
macro_rules! fields {
    ($($part:ident),*) => {$(
        impl ser::$part for Compound<'_> {
            type Ok = ();
            type Error = TranscodeError;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), TranscodeError> {
                self.entry(key, value)
            }
            fn end(self) -> Result<(), TranscodeError> {
                self.close()
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

/// An object being written from a map: each key is written as the string serde_json makes of
/// it.
struct MapWriter<'a> {
    c: Compound<'a>,
}

impl ser::SerializeMap for MapWriter<'_> {
    type Ok = ();
    type Error = TranscodeError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), TranscodeError> {
        self.c.count += 1;
        key.serialize(KeyWriter(&mut *self.c.w))
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), TranscodeError> {
        value.serialize(&mut *self.c.w)
    }
    fn end(self) -> Result<(), TranscodeError> {
        self.c.close()
    }
}

/// Writes a map key as its string (as serde_json's map keys are made).
struct KeyWriter<'a>(&'a mut TreeWriter);

impl KeyWriter<'_> {
    fn text(self, s: &str) -> Result<(), TranscodeError> {
        self.0.str_bytes(s);
        Ok(())
    }
}

fn key_error() -> TranscodeError {
    TranscodeError("a map key must be a string, a number, a bool or a unit variant".into())
}

impl ser::Serializer for KeyWriter<'_> {
    type Ok = ();
    type Error = TranscodeError;
    type SerializeSeq = Impossible<(), TranscodeError>;
    type SerializeTuple = Impossible<(), TranscodeError>;
    type SerializeTupleStruct = Impossible<(), TranscodeError>;
    type SerializeTupleVariant = Impossible<(), TranscodeError>;
    type SerializeMap = Impossible<(), TranscodeError>;
    type SerializeStruct = Impossible<(), TranscodeError>;
    type SerializeStructVariant = Impossible<(), TranscodeError>;

    fn serialize_str(self, v: &str) -> Result<(), TranscodeError> {
        self.text(v)
    }
    fn serialize_char(self, v: char) -> Result<(), TranscodeError> {
        self.text(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_bool(self, v: bool) -> Result<(), TranscodeError> {
        self.text(if v { "true" } else { "false" })
    }
    key_numbers!(
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128)
    );
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), TranscodeError> {
        self.text(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), TranscodeError> {
        value.serialize(self)
    }
    fn serialize_f32(self, _: f32) -> Result<(), TranscodeError> {
        Err(key_error())
    }
    fn serialize_f64(self, _: f64) -> Result<(), TranscodeError> {
        Err(key_error())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), TranscodeError> {
        Err(key_error())
    }
    fn serialize_none(self) -> Result<(), TranscodeError> {
        Err(key_error())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), TranscodeError> {
        Err(key_error())
    }
    fn serialize_unit(self) -> Result<(), TranscodeError> {
        Err(key_error())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), TranscodeError> {
        Err(key_error())
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), TranscodeError> {
        Err(key_error())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, TranscodeError> {
        Err(key_error())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, TranscodeError> {
        Err(key_error())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, TranscodeError> {
        Err(key_error())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, TranscodeError> {
        Err(key_error())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, TranscodeError> {
        Err(key_error())
    }
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, TranscodeError> {
        Err(key_error())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, TranscodeError> {
        Err(key_error())
    }
}

#[cfg(test)]
mod tests {
    use super::super::json::JsonTree;
    use super::*;
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    fn back<T: Serialize>(value: &T) -> Value {
        let bytes = tree_bytes(value).unwrap();
        let tree: JsonTree = postcard::from_bytes(&bytes).unwrap();
        tree.into_value().unwrap()
    }

    #[derive(Serialize)]
    enum Kind {
        Unit,
        New(u8),
        Tuple(i32, String),
        Struct { a: f64, b: Option<bool> },
    }

    #[derive(Serialize)]
    struct Record {
        n: u32,
        neg: i64,
        big: u64,
        f: f64,
        nan: f64,
        c: char,
        s: String,
        none: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        empty: Vec<u8>,
        bytes: Vec<u8>,
        kinds: Vec<Kind>,
        by_kind: BTreeMap<Kind2, u32>,
        by_num: BTreeMap<u64, String>,
        pair: (u8, String),
        value: Value,
        #[serde(flatten)]
        extra: BTreeMap<String, Value>,
        unit: (),
    }

    #[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
    enum Kind2 {
        Timeout,
        RateLimit,
    }

    #[test]
    fn a_value_transcoded_reads_back_as_its_json_value() {
        let r = Record {
            n: 7,
            neg: -300,
            big: u64::MAX,
            f: 0.1,
            nan: f64::NAN,
            c: 'é',
            s: "héllo \"x\"\n".into(),
            none: None,
            empty: vec![],
            bytes: vec![1, 200],
            kinds: vec![
                Kind::Unit,
                Kind::New(3),
                Kind::Tuple(-1, "t".into()),
                Kind::Struct {
                    a: 2.5,
                    b: Some(true),
                },
            ],
            by_kind: BTreeMap::from([(Kind2::Timeout, 2), (Kind2::RateLimit, 1)]),
            by_num: BTreeMap::from([(3, "three".into())]),
            pair: (1, "one".into()),
            value: json!({"rows": [[0, "a", 1.5]], "deep": {"x": null, "y": [-2, 1e300]}}),
            extra: BTreeMap::from([("flat".into(), json!([1, 2]))]),
            unit: (),
        };
        assert_eq!(back(&r), serde_json::to_value(&r).unwrap());
    }

    #[test]
    fn a_large_value_s_counts_take_more_than_a_byte() {
        let long: Vec<u32> = (0..300).collect();
        let map: BTreeMap<String, u32> = (0..200).map(|i| (format!("k{i}"), i)).collect();
        let v = json!({"long": long, "map": map, "text": "x".repeat(20_000)});
        assert_eq!(back(&v), v);
    }

    #[test]
    fn a_map_whose_keys_have_no_string_form_is_refused() {
        let m = BTreeMap::from([((1, 2), 3)]);
        assert!(tree_bytes(&m).is_err());
        assert!(serde_json::to_value(&m).is_err());
    }

    #[test]
    fn the_bytes_are_what_the_tree_itself_writes() {
        let v = json!({"a": [1, -2, 2.5, "s", null, true], "b": {}});
        let tree: JsonTree = postcard::from_bytes(&tree_bytes(&v).unwrap()).unwrap();
        assert_eq!(
            postcard::to_allocvec(&tree).unwrap(),
            tree_bytes(&v).unwrap()
        );
    }
}

//! Request bodies as sent: each field of a decision request as the JSON had it, read
//! straight from the bytes (strings borrowed where they hold no escapes), before
//! [`crate::api`] checks them and says what is wrong.
//!
//! Reading into these instead of a `serde_json::Value` saves the tree of maps and strings
//! that every request would otherwise build and throw away, while keeping what the
//! error messages need: the JSON type of a field of the wrong type, the number as written,
//! and the first unknown field in the order a JSON object's keys sort.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Number;

/// One field's value as sent.
#[derive(Debug, Default, PartialEq)]
pub(crate) enum Field<'a> {
    /// Absent, or `null`.
    #[default]
    Missing,
    Str(Cow<'a, str>),
    Number(Number),
    /// A boolean, array or object, named as an error message names it ("a boolean").
    Other(&'static str),
}

impl Field<'_> {
    /// The JSON type, as an error message names it.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Field::Missing => "null",
            Field::Str(_) => "a string",
            Field::Number(_) => "a number",
            Field::Other(kind) => kind,
        }
    }
}

/// A decision request's fields, as sent.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct RawAsk<'a> {
    pub(crate) policy: Field<'a>,
    pub(crate) key: Field<'a>,
    pub(crate) op: Field<'a>,
    pub(crate) cost: Field<'a>,
    pub(crate) max_wait_ms: Field<'a>,
    /// The first field that is none of the above, in the order JSON object keys sort.
    pub(crate) unknown: Option<String>,
    /// The first field that appears more than once (refused: which one counts would be a
    /// guess).
    pub(crate) duplicate: Option<String>,
}

/// The names of a decision request's fields, in the order errors list them.
pub(crate) const FIELDS: &[&str] = &["policy", "key", "op", "cost", "max_wait_ms"];

/// A JSON value that should be a decision request: an object's fields, or the type it was
/// instead (`"an array"`).
#[derive(Debug, PartialEq)]
pub(crate) enum Item<'a> {
    Object(RawAsk<'a>),
    Not(&'static str),
}

/// The batch endpoint's body: an array of requests, or the type it was instead.
#[derive(Debug, PartialEq)]
pub(crate) enum Batch<'a> {
    Array(Vec<Item<'a>>),
    Not(&'static str),
}

/// Drains whatever remains of a sequence.
fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Drains whatever remains of a map.
fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Implements the scalar `visit_*` methods of a visitor whose every non-container answer
/// is `$not(kind)` (one answer per JSON type, so no value is ever refused by serde).
macro_rules! visit_scalars_as {
    ($not:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($not("a boolean"))
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($not("a number"))
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($not("a number"))
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($not("a number"))
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($not("a string"))
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($not("null"))
        }
    };
}

impl<'de> Deserialize<'de> for Field<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldVisitor;
        impl<'de> Visitor<'de> for FieldVisitor {
            type Value = Field<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Field<'de>, E> {
                Ok(Field::Other("a boolean"))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Field<'de>, E> {
                Ok(Field::Number(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Field<'de>, E> {
                Ok(Field::Number(n.into()))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Field<'de>, E> {
                // JSON numbers are finite, so this is never `Other`.
                Ok(Number::from_f64(n).map_or(Field::Other("a number"), Field::Number))
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Field<'de>, E> {
                Ok(Field::Str(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Field<'de>, E> {
                Ok(Field::Str(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Field<'de>, E> {
                Ok(Field::Str(Cow::Owned(s)))
            }
            fn visit_unit<E>(self) -> Result<Field<'de>, E> {
                Ok(Field::Missing)
            }
            fn visit_none<E>(self) -> Result<Field<'de>, E> {
                Ok(Field::Missing)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Field<'de>, A::Error> {
                skip_seq(seq)?;
                Ok(Field::Other("an array"))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Field<'de>, A::Error> {
                skip_map(map)?;
                Ok(Field::Other("an object"))
            }
        }
        deserializer.deserialize_any(FieldVisitor)
    }
}

/// A field name: one of [`FIELDS`], or another (kept only to be named in an error).
enum Name {
    Known(usize),
    Unknown(String),
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl Visitor<'_> for NameVisitor {
            type Value = Name;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, s: &str) -> Result<Name, E> {
                Ok(match FIELDS.iter().position(|&f| f == s) {
                    Some(i) => Name::Known(i),
                    None => Name::Unknown(s.to_owned()),
                })
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

/// A body read again after it failed to parse: each request field's value is taken as
/// written, then read on its own, so that a number JSON allows but a double cannot hold
/// (`1e309`) is that field's error rather than the whole body's. Only failed bodies pay for
/// reading values twice.
pub(crate) struct Careful<T>(pub(crate) T);

impl<'de> Deserialize<'de> for Item<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ItemVisitor::<false>)
    }
}

impl<'de> Deserialize<'de> for Careful<Item<'de>> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(ItemVisitor::<true>)
            .map(Careful)
    }
}

/// Reads a request object; `CAREFUL`: see [`Careful`].
struct ItemVisitor<const CAREFUL: bool>;

impl<'de, const CAREFUL: bool> Visitor<'de> for ItemVisitor<CAREFUL> {
    type Value = Item<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    visit_scalars_as!(Item::Not);
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Item<'de>, A::Error> {
        skip_seq(seq)?;
        Ok(Item::Not("an array"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Item<'de>, A::Error> {
        let mut ask = RawAsk::default();
        let mut seen = [false; FIELDS.len()];
        let mut unknown_seen: Vec<String> = Vec::new();
        while let Some(name) = map.next_key::<Name>()? {
            match name {
                Name::Known(i) => {
                    let value = if CAREFUL {
                        let raw = map.next_value::<&'de RawValue>()?;
                        serde_json::from_str::<Field<'de>>(raw.get())
                            .unwrap_or(Field::Other("a number too large for a double"))
                    } else {
                        map.next_value::<Field<'de>>()?
                    };
                    if std::mem::replace(&mut seen[i], true) {
                        ask.duplicate.get_or_insert_with(|| FIELDS[i].to_string());
                    }
                    match i {
                        0 => ask.policy = value,
                        1 => ask.key = value,
                        2 => ask.op = value,
                        3 => ask.cost = value,
                        _ => ask.max_wait_ms = value,
                    }
                }
                Name::Unknown(name) => {
                    map.next_value::<IgnoredAny>()?;
                    if unknown_seen.contains(&name) {
                        ask.duplicate.get_or_insert_with(|| name.clone());
                    } else {
                        unknown_seen.push(name.clone());
                    }
                    if ask.unknown.as_ref().is_none_or(|first| name < *first) {
                        ask.unknown = Some(name);
                    }
                }
            }
        }
        Ok(Item::Object(ask))
    }
}

impl<'de> Deserialize<'de> for Batch<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(BatchVisitor::<false>)
    }
}

impl<'de> Deserialize<'de> for Careful<Batch<'de>> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(BatchVisitor::<true>)
            .map(Careful)
    }
}

/// Reads a batch; `CAREFUL`: see [`Careful`].
struct BatchVisitor<const CAREFUL: bool>;

impl<'de, const CAREFUL: bool> Visitor<'de> for BatchVisitor<CAREFUL> {
    type Value = Batch<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array")
    }
    visit_scalars_as!(Batch::Not);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Batch<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        loop {
            let item = if CAREFUL {
                seq.next_element::<Careful<Item<'de>>>()?.map(|c| c.0)
            } else {
                seq.next_element::<Item<'de>>()?
            };
            match item {
                Some(item) => items.push(item),
                None => return Ok(Batch::Array(items)),
            }
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Batch<'de>, A::Error> {
        skip_map(map)?;
        Ok(Batch::Not("an object"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Reads `json` as the service does: fast, then carefully if that failed.
    fn item(json: &str) -> Item<'_> {
        match serde_json::from_str(json) {
            Ok(item) => item,
            Err(e) => match serde_json::from_str::<Careful<Item>>(json) {
                Ok(careful) => careful.0,
                Err(_) => panic!("{json}: {e}"),
            },
        }
    }

    /// Reads `json` both ways: into [`Item`], and into a `Value` turned into the same
    /// shape by hand; the two must agree.
    fn agrees_with_value(json: &str) {
        let value: Value = match serde_json::from_str(json) {
            Ok(v) => v,
            Err(e) => panic!("{json}: {e}"),
        };
        let field = |v: Option<&Value>| match v {
            None | Some(Value::Null) => Field::Missing,
            Some(Value::String(s)) => Field::Str(Cow::Owned(s.clone())),
            Some(Value::Number(n)) => Field::Number(n.clone()),
            Some(Value::Bool(_)) => Field::Other("a boolean"),
            Some(Value::Array(_)) => Field::Other("an array"),
            Some(Value::Object(_)) => Field::Other("an object"),
        };
        let expected = match &value {
            Value::Object(m) => Item::Object(RawAsk {
                policy: field(m.get("policy")),
                key: field(m.get("key")),
                op: field(m.get("op")),
                cost: field(m.get("cost")),
                max_wait_ms: field(m.get("max_wait_ms")),
                unknown: m.keys().find(|k| !FIELDS.contains(&k.as_str())).cloned(),
                duplicate: None,
            }),
            Value::Array(_) => Item::Not("an array"),
            Value::String(_) => Item::Not("a string"),
            Value::Number(_) => Item::Not("a number"),
            Value::Bool(_) => Item::Not("a boolean"),
            Value::Null => Item::Not("null"),
        };
        // A `Value` keeps the last of repeated fields and cannot say which were repeated:
        // that is compared apart (see the test of repeated fields).
        let mut actual = item(json);
        if let Item::Object(ask) = &mut actual {
            ask.duplicate = None;
        }
        assert_eq!(actual, expected, "{json}");
    }

    #[test]
    fn reads_every_field_as_sent() {
        let Item::Object(ask) =
            item(r#"{"policy": "p", "key": "k\"q", "op": null, "cost": 2, "max_wait_ms": 1.5}"#)
        else {
            panic!("not an object");
        };
        assert_eq!(ask.policy, Field::Str(Cow::Borrowed("p")));
        assert!(matches!(ask.policy, Field::Str(Cow::Borrowed(_))));
        // An escaped string cannot be borrowed, and is unescaped.
        assert_eq!(ask.key, Field::Str(Cow::Owned("k\"q".into())));
        assert_eq!(ask.op, Field::Missing);
        assert_eq!(ask.cost, Field::Number(2u64.into()));
        assert_eq!(ask.max_wait_ms.kind(), "a number");
        assert_eq!(ask.unknown, None);
    }

    #[test]
    fn a_repeated_field_is_named_and_a_huge_number_is_its_field_s_error() {
        let Item::Object(ask) = item(r#"{"key": "a", "policy": "p", "key": "b"}"#) else {
            panic!("not an object");
        };
        assert_eq!(ask.duplicate.as_deref(), Some("key"));
        let Item::Object(ask) = item(r#"{"x": 1, "key": "a", "x": 2}"#) else {
            panic!("not an object");
        };
        assert_eq!(ask.duplicate.as_deref(), Some("x"));
        let Item::Object(ask) = item(r#"{"key": "a", "cost": 1e309}"#) else {
            panic!("not an object");
        };
        assert_eq!(ask.duplicate, None);
        assert_eq!(ask.cost, Field::Other("a number too large for a double"));
        assert_eq!(ask.key, Field::Str(Cow::Borrowed("a")));
        let Item::Object(ask) = item(r#"{"cost": -3, "max_wait_ms": 1e400}"#) else {
            panic!("not an object");
        };
        assert_eq!(ask.max_wait_ms.kind(), "a number too large for a double");
        assert_eq!(ask.cost, Field::Number((-3i64).into()));
    }

    #[test]
    fn agrees_with_reading_into_a_value() {
        for json in [
            r#"{}"#,
            r#"{"policy": 5, "key": true, "op": [1, {"a": 2}], "cost": {"x": []}}"#,
            r#"{"zeta": 1, "colour": "red", "alpha": {"deep": [1, 2]}, "key": "k"}"#,
            r#"{"cost": 18446744073709551616, "max_wait_ms": -0.0}"#,
            r#"{"key": "first", "key": "second", "cost": "3", "cost": 3}"#,
            r#"{"key": 1, "key": null}"#,
            r#"{"\u0070olicy": "\u00e9t\u00e9"}"#,
            r#"[]"#,
            r#"[{"policy": "p"}]"#,
            r#""policy""#,
            r#"12"#,
            r#"false"#,
            r#"null"#,
        ] {
            if serde_json::from_str::<Value>(json).is_ok() {
                agrees_with_value(json);
            } else {
                assert!(serde_json::from_str::<Item>(json).is_err(), "{json}");
            }
        }
    }

    #[test]
    fn malformed_json_fails_as_it_would_into_a_value() {
        for json in [
            "{not json",
            "",
            "{\"key\": }",
            "{} {}",
            "[1,]",
            "{\"a\":1,}",
        ] {
            let into_value = serde_json::from_str::<Value>(json).map(drop);
            let into_item = serde_json::from_str::<Item>(json).map(drop);
            assert_eq!(
                into_item.map_err(|e| e.to_string()),
                into_value.map_err(|e| e.to_string()),
                "{json}"
            );
        }
    }

    #[test]
    fn a_batch_is_an_array_of_items_or_names_its_type() {
        let Ok(Batch::Array(items)) =
            serde_json::from_str::<Batch>(r#"[{"key": "a"}, 3, [], {"b": 1}]"#)
        else {
            panic!("not read as an array");
        };
        assert_eq!(items.len(), 4);
        assert!(matches!(&items[0], Item::Object(a) if a.key == Field::Str("a".into())));
        assert_eq!(items[1], Item::Not("a number"));
        assert_eq!(items[2], Item::Not("an array"));
        assert!(matches!(&items[3], Item::Object(a) if a.unknown.as_deref() == Some("b")));
        for (json, kind) in [
            (r#"{"a": [1]}"#, "an object"),
            ("\"x\"", "a string"),
            ("1.5", "a number"),
            ("true", "a boolean"),
            ("null", "null"),
        ] {
            assert_eq!(
                serde_json::from_str::<Batch>(json).ok(),
                Some(Batch::Not(kind))
            );
        }
    }
}

//! Request bodies as sent: a decision request's fields read by serde's derive straight
//! from the bytes (strings borrowed where they hold no escapes), before the route modules
//! check their values against the policies (`decisions`, `leases`, `queues`).
//!
//! A body that does not read is read a second time through `serde_path_to_error`, which
//! finds the field the error belongs to, so that only failing bodies pay for tracking it.

use std::borrow::Cow;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Number;
use utoipa::ToSchema;

/// A string field as sent: borrowed from the body unless it holds escapes.
#[derive(Debug, Deserialize, PartialEq)]
pub(crate) struct Text<'a>(#[serde(borrow)] pub(crate) Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// A decision request's fields, as sent; absent and `null` are both `None`. A field given
/// twice, or one that is none of these, is refused.
///
/// One limit takes `policy` and `key`; a set of limits decided as one takes `limits` in
/// their place.
#[derive(Debug, Deserialize, PartialEq, ToSchema)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object with `policy` and `key`"
)]
#[schema(
    as = DecisionRequest,
    example = json!({"policy": "gcra:rate=10/s,burst=5", "key": "user:42", "op": "limit"})
)]
pub(crate) struct RawAsk<'a> {
    /// A configured policy's name, or an inline spec (`gcra:rate=10/s,burst=5`); a spec
    /// that does not parse is a `400` naming `policy.FIELD`. The pattern: a name, or the
    /// spec forms this document vouches for (every algorithm's spec is taken).
    #[serde(borrow)]
    #[schema(value_type = Option<String>, pattern = "^([^:]*|gcra:rate=[1-9][0-9]{0,3}/(s|m|h),burst=[1-9][0-9]{0,3}|(fixed_window|sliding_window):limit=[1-9][0-9]{0,3},window=[1-9][0-9]{0,2}(s|m|h)|concurrency:limit=[1-9][0-9]{0,3},lease=[1-9][0-9]{0,2}(s|m))$")]
    pub(crate) policy: Option<Text<'a>>,
    /// The key limited: a user, a tenant, an API route (1 to 512 bytes).
    #[serde(borrow)]
    #[schema(value_type = Option<String>, min_length = 1, max_length = 512)]
    pub(crate) key: Option<Text<'a>>,
    /// `limit` (admit or refuse now), `pace` (book the earliest slot and say how long to
    /// wait) or `peek` (what `limit` would answer, changing nothing); `limit` by default.
    #[serde(borrow)]
    #[schema(value_type = Option<OpName>)]
    pub(crate) op: Option<Text<'a>>,
    /// How many units the request takes; 1 by default.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1_099_511_627_776_u64)]
    pub(crate) cost: Option<Number>,
    /// For `pace`: the longest wait accepted, in ms; a longer one is refused (`429`)
    /// without booking.
    #[schema(value_type = Option<f64>, minimum = 0, maximum = 1e13)]
    pub(crate) max_wait_ms: Option<Number>,
    /// A set of limits decided as one, in place of `policy` and `key`.
    #[serde(borrow)]
    pub(crate) limits: Option<Vec<RawLimit<'a>>>,
}

/// One limit of a set, as sent.
#[derive(Debug, Deserialize, PartialEq, ToSchema)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object with `policy` and `key`"
)]
#[schema(as = DecisionLimit)]
pub(crate) struct RawLimit<'a> {
    /// A configured policy's name, or an inline spec. The pattern: a name, or the spec
    /// forms this document vouches for in a set (a set that is paced refuses limits that
    /// cannot book ahead, as `sliding_window` and `concurrency`, naming `op`).
    #[serde(borrow)]
    #[schema(value_type = String, required = true, pattern = "^([^:]*|gcra:rate=[1-9][0-9]{0,3}/(s|m|h),burst=[1-9][0-9]{0,3}|fixed_window:limit=[1-9][0-9]{0,3},window=[1-9][0-9]{0,2}(s|m|h))$")]
    pub(crate) policy: Option<Text<'a>>,
    /// The key this limit counts: 1 to 512 bytes.
    #[serde(borrow)]
    #[schema(value_type = String, required = true, min_length = 1, max_length = 512)]
    pub(crate) key: Option<Text<'a>>,
    /// This limit's own cost, in place of the request's.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1_099_511_627_776_u64)]
    pub(crate) cost: Option<Number>,
}

// The values `op` takes, for the OpenAPI document only: the handlers read the op from its
// text (`fields::op_field`), which names the field in its error.
/// What a decision does: `limit`, `pace`, `peek` or `charge` (count a cost already spent,
/// past the limit if need be; never refused).
#[derive(ToSchema)]
#[schema(as = Op, rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum OpName {
    Limit,
    Pace,
    Peek,
    Charge,
}

/// What is allowed in each field of a request, as an error message says it.
const ALLOWED: &[(&str, &str)] = &[
    ("policy", "a string: a configured policy's name or a spec"),
    ("key", "a string"),
    ("op", "a string: pace, limit, peek or charge"),
    ("cost", "a whole number of at least 1"),
    ("max_wait_ms", "a number of milliseconds from 0 to 1e13"),
    (
        "limits",
        "an array of objects, each with `policy`, `key` and optionally `cost`",
    ),
];

/// Why a body was refused: the field it names (`body` for the body as a whole) and what
/// is wrong.
#[derive(Debug, PartialEq)]
pub(crate) struct BodyError {
    pub(crate) field: String,
    pub(crate) message: String,
}

impl BodyError {
    fn body(message: String) -> BodyError {
        BodyError {
            field: "body".into(),
            message,
        }
    }
}

/// The JSON type of a valid JSON text, from its first character, as a message names it.
fn kind(json: &str) -> &'static str {
    match json.trim_start().as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// Reads one decision request.
///
/// Only an object is a request: serde's derive would also take an array of the fields'
/// values in order, which no client means.
pub(crate) fn ask(json: &str) -> Result<RawAsk<'_>, BodyError> {
    object(json, "a JSON object with `policy` and `key`", ALLOWED)
}

/// Reads a JSON object into `T` (a derived struct), or says what is wrong: a body that is
/// no object (`must be WHAT, not an array`), malformed JSON, or the field at fault, with
/// what `allowed` says the field takes.
pub(crate) fn object<'a, T: Deserialize<'a>>(
    json: &'a str,
    what: &str,
    allowed: &[(&str, &str)],
) -> Result<T, BodyError> {
    if !json.trim_start().starts_with('{') {
        return Err(not_a(json, what));
    }
    serde_json::from_str(json).map_err(|_| explain::<T>(json, allowed))
}

/// The error of a body that is not the JSON type expected (`what`), or not JSON at all.
fn not_a(json: &str, what: &str) -> BodyError {
    match serde_json::from_str::<IgnoredAny>(json) {
        Ok(_) => BodyError::body(format!("must be {what}, not {}", kind(json))),
        Err(e) => BodyError::body(format!("not valid JSON: {e}")),
    }
}

/// Says where an object that failed to read into `T` went wrong.
#[cold]
fn explain<'a, T: Deserialize<'a>>(json: &'a str, allowed: &[(&str, &str)]) -> BodyError {
    // Malformed JSON is the body's error wherever it shows; JSON that reads but not into a
    // request (a wrong type, a number no double holds) is the field's.
    if let Err(syntax) = serde_json::from_str::<IgnoredAny>(json) {
        return BodyError::body(format!("not valid JSON: {syntax}"));
    }
    let mut reader = serde_json::Deserializer::from_str(json);
    let Err(e) = serde_path_to_error::deserialize::<_, T>(&mut reader) else {
        return BodyError::body("could not be read as a request".into());
    };
    let field = e.path().to_string();
    let inner = e.into_inner();
    match allowed.iter().find(|(name, _)| *name == field) {
        Some((name, allowed)) => BodyError {
            field: (*name).to_string(),
            message: format!("{inner}; use {allowed}"),
        },
        // An unknown field (the path is its name, and serde's message lists the fields), or
        // a value of the wrong type in a field `allowed` does not describe.
        None if field != "." => BodyError {
            field,
            message: inner.to_string(),
        },
        // A field given twice: the derive reports it on the object, so the field is found
        // by reading the keys; serde's message names it too.
        None => match first_repeated_key(json) {
            Some(key) => BodyError {
                field: key,
                message: format!("{inner}: it appears more than once; send each field once"),
            },
            None => BodyError::body(inner.to_string()),
        },
    }
}

/// The first key a JSON object gives twice, if any (read only for a body that failed).
fn first_repeated_key(json: &str) -> Option<String> {
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
            let (mut seen, mut repeated) = (std::collections::HashSet::new(), None);
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                // The map is read to its end either way, as the reader checks.
                if repeated.is_none() && !seen.insert(key.clone()) {
                    repeated = Some(key);
                }
            }
            Ok(repeated)
        }
    }
    serde::Deserializer::deserialize_map(&mut serde_json::Deserializer::from_str(json), Keys)
        .ok()
        .flatten()
}

/// Reads a batch: an array of requests, each read on its own so that one bad request is
/// that request's error, not the batch's.
pub(crate) fn batch(json: &str) -> Result<Vec<Result<RawAsk<'_>, BodyError>>, BodyError> {
    Ok(array(json, "a JSON array of requests")?
        .into_iter()
        .map(|item| ask(item.get()))
        .collect())
}

/// The items of a JSON array, each as written, to be read on its own; or the error of a
/// body that is no array (`must be WHAT, not an object`) or not JSON.
pub(crate) fn array<'a>(json: &'a str, what: &str) -> Result<Vec<&'a RawValue>, BodyError> {
    if !json.trim_start().starts_with('[') {
        return Err(not_a(json, what));
    }
    serde_json::from_str(json).map_err(|e| BodyError::body(format!("not valid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn fields(json: &str) -> RawAsk<'_> {
        match ask(json) {
            Ok(ask) => ask,
            Err(e) => panic!("{json}: {e:?}"),
        }
    }

    fn refused(json: &str) -> BodyError {
        match ask(json) {
            Ok(ask) => panic!("{json} was read: {ask:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn reads_every_field_as_sent() {
        let ask =
            fields(r#"{"policy": "p", "key": "k\"q", "op": null, "cost": 2, "max_wait_ms": 1.5}"#);
        assert!(matches!(ask.policy, Some(Text(Cow::Borrowed("p")))));
        // An escaped string cannot be borrowed, and is unescaped.
        assert_eq!(ask.key, Some(Text(Cow::Owned("k\"q".into()))));
        assert_eq!(ask.op, None);
        assert_eq!(ask.cost, Some(2u64.into()));
        assert_eq!(ask.max_wait_ms.and_then(|n| n.as_f64()), Some(1.5));
        assert_eq!(fields("{}"), fields(r#"{"policy": null}"#));
    }

    #[test]
    fn a_wrong_field_is_named_with_what_it_allows() {
        for (json, field, says) in [
            (
                r#"{"policy": 5, "key": "k"}"#,
                "policy",
                "configured policy",
            ),
            (r#"{"key": true}"#, "key", "a string"),
            (
                r#"{"key": "k", "op": ["pace"]}"#,
                "op",
                "pace, limit, peek or charge",
            ),
            (r#"{"key": "k", "cost": "3"}"#, "cost", "whole number"),
            (r#"{"key": "a", "cost": 1e309}"#, "cost", "whole number"),
            (
                r#"{"cost": -3, "max_wait_ms": 1e400}"#,
                "max_wait_ms",
                "milliseconds",
            ),
        ] {
            let e = refused(json);
            assert_eq!(e.field, field, "{json}: {}", e.message);
            assert!(e.message.contains(says), "{json}: {}", e.message);
        }
    }

    #[test]
    fn unknown_and_repeated_fields_are_refused_by_name() {
        let e = refused(r#"{"key": "k", "colour": "red"}"#);
        assert_eq!(e.field, "colour");
        assert!(e.message.contains("`max_wait_ms`"), "{}", e.message);
        for (json, name) in [
            (r#"{"key": "a", "policy": "p", "key": "b"}"#, "`key`"),
            (r#"{"cost": 1, "cost": 1}"#, "`cost`"),
            (r#"{"policy": "p", "policy": "p", "key": "k"}"#, "`policy`"),
        ] {
            let e = refused(json);
            assert_eq!(format!("`{}`", e.field), name, "{json}");
            assert!(
                e.message.contains(name) && e.message.contains("once"),
                "{json}: {}",
                e.message
            );
        }
    }

    #[test]
    fn only_an_object_is_a_request() {
        for (json, kind) in [
            (r#"["p", "k"]"#, "an array"),
            (r#""policy""#, "a string"),
            ("12", "a number"),
            (" -1", "a number"),
            ("false", "a boolean"),
            ("null", "null"),
        ] {
            let e = refused(json);
            assert_eq!(
                (
                    e.field.as_str(),
                    e.message.ends_with(&format!("not {kind}"))
                ),
                ("body", true),
                "{json}: {}",
                e.message
            );
        }
    }

    #[test]
    fn malformed_json_is_the_body_s_error_as_serde_json_says_it() {
        for json in [
            "{not json",
            "",
            "{\"key\": }",
            "{} {}",
            "[1,]",
            "{\"a\":1,}",
        ] {
            let e = refused(json);
            let Err(expected) = serde_json::from_str::<Value>(json) else {
                panic!("{json} is valid JSON");
            };
            assert_eq!(e.field, "body", "{json}");
            assert!(
                e.message.starts_with("not valid JSON")
                    && e.message.contains(&format!("column {}", expected.column())),
                "{json}: {} (serde_json: {expected})",
                e.message
            );
        }
    }

    #[test]
    fn a_batch_reads_each_request_on_its_own_or_names_its_type() {
        let json = r#"[{"key": "a"}, 3, [], {"b": 1}, {"key": "k\n"}]"#;
        let Ok(items) = batch(json) else {
            panic!("not read as an array");
        };
        assert_eq!(items.len(), 5);
        assert!(matches!(&items[0], Ok(a) if a.key.as_deref() == Some("a")));
        assert!(matches!(&items[1], Err(e) if e.message.ends_with("not a number")));
        assert!(matches!(&items[2], Err(e) if e.message.ends_with("not an array")));
        assert!(matches!(&items[3], Err(e) if e.field == "b"));
        assert!(matches!(&items[4], Ok(a) if a.key.as_deref() == Some("k\n")));
        for (json, kind) in [
            (r#"{"a": [1]}"#, "an object"),
            ("\"x\"", "a string"),
            ("1.5", "a number"),
            ("true", "a boolean"),
            ("null", "null"),
        ] {
            let Err(e) = batch(json) else {
                panic!("{json} read as a batch");
            };
            assert!(e.message.ends_with(&format!("not {kind}")), "{json}");
        }
        let Err(e) = batch("[{\"key\": \"a\"},") else {
            panic!("a cut batch was read");
        };
        assert!(e.message.starts_with("not valid JSON"), "{}", e.message);
    }
}

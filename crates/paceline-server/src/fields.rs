//! The checks of a request's fields that more than one endpoint shares: a key's length, a
//! cost, an op, and any number field with its allowed range.

use std::time::Duration;

use paceline_store::Op;
use serde_json::Number;

use crate::error::ApiError;

/// The longest key, in bytes.
pub const MAX_KEY: usize = 512;

/// Keys are 1 to [`MAX_KEY`] bytes; errors name `field`.
pub(crate) fn check_key(key: &str, field: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(ApiError::invalid(
            field,
            format!("must be 1 to {MAX_KEY} bytes long"),
        ));
    }
    Ok(())
}

/// A request's cost (`field`): a whole number of at least 1, if given.
pub(crate) fn cost_field(cost: Option<&Number>, field: &str) -> Result<Option<u64>, ApiError> {
    number_field(cost, field, "use a whole number of at least 1", |n| {
        whole(n).filter(|&c| c >= 1)
    })
}

/// A whole number from 0 up, as JSON (and JSON Schema's `integer`) has it: `7`, or `7.0`
/// (up to 2^53, past which a float is no longer whole to the unit).
pub(crate) fn whole(n: &Number) -> Option<u64> {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..=EXACT).contains(f))
            .map(|f| f as u64)
    })
}

/// A number field of a request: `None` if absent or null, else what `convert` makes of it,
/// which refuses a number by returning `None` (the error then says what is `allowed`).
pub(crate) fn number_field<T>(
    field: Option<&Number>,
    name: &str,
    allowed: &str,
    convert: impl Fn(&Number) -> Option<T>,
) -> Result<Option<T>, ApiError> {
    let Some(n) = field else {
        return Ok(None);
    };
    match convert(n) {
        Some(value) => Ok(Some(value)),
        None => Err(ApiError::invalid(
            name,
            format!("{n} is not allowed; {allowed}"),
        )),
    }
}

/// A request's op, with its `max_wait_ms` (for `pace` only).
pub(crate) fn op_field(name: &str, max_wait_ms: Option<&Number>) -> Result<Op, ApiError> {
    let max_wait = number_field(
        max_wait_ms,
        "max_wait_ms",
        "use milliseconds from 0 to 1e13",
        |n| {
            n.as_f64()
                .filter(|ms| (0.0..=1e13).contains(ms))
                .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        },
    )?;
    match (name, max_wait) {
        ("pace", None) => Ok(Op::pace()),
        ("pace", Some(w)) => Ok(Op::pace_within(w)),
        ("limit" | "peek" | "charge", Some(_)) => {
            Err(ApiError::invalid("max_wait_ms", "applies to `pace` only"))
        }
        ("limit", None) => Ok(Op::Limit),
        ("peek", None) => Ok(Op::Peek),
        ("charge", None) => Ok(Op::Charge),
        (other, _) => Err(ApiError::invalid(
            "op",
            format!("`{other}` is not an op; use pace, limit, peek or charge"),
        )),
    }
}

//! The checks of a request's fields that more than one endpoint shares: a key's length, a
//! cost, and any number field with its allowed range.

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
        n.as_u64().filter(|&c| c >= 1)
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

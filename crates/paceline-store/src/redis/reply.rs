//! A function's reply, and the reader that decodes it in order.

use paceline_core::{StoreError, StoreErrorKind};
use redis::Value;

/// What a library's function answered (see [`FunctionHost::call`](super::FunctionHost::call)):
/// a number, a string, nothing, or a list of replies. Front ends decode it with a [`Reader`].
///
/// ```
/// use paceline_store::redis::Reply;
/// let reply = Reply::list([Reply::from(7), Reply::from("ok")]);
/// let mut r = reply.reader("the doc's function")?;
/// assert_eq!(r.u64()?, 7);
/// assert_eq!(r.text()?, "ok");
/// assert!(r.is_empty());
/// # Ok::<(), paceline_store::StoreError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Reply(Value);

impl Reply {
    pub(super) fn new(value: Value) -> Reply {
        Reply(value)
    }

    /// A list of `replies` (for tests of decoders, and combined calls' answers).
    pub fn list(replies: impl IntoIterator<Item = Reply>) -> Reply {
        Reply(Value::Array(replies.into_iter().map(|r| r.0).collect()))
    }

    /// The reply as a number, if it is one.
    pub fn int(&self) -> Option<i64> {
        match self.0 {
            Value::Int(n) => Some(n),
            _ => None,
        }
    }

    /// The number found by following the first item of nested lists `depth` times, without
    /// taking the reply apart: `head_int(1)` is the first item of a list, `head_int(2)` the
    /// first item of the first item (e.g. the time a library puts at the head of an answer).
    ///
    /// ```
    /// use paceline_store::redis::Reply;
    /// let reply = Reply::list([Reply::list([Reply::from(7), Reply::from("ok")])]);
    /// assert_eq!(reply.head_int(2), Some(7));
    /// assert_eq!(reply.head_int(1), None);
    /// ```
    pub fn head_int(&self, depth: usize) -> Option<i64> {
        let mut value = &self.0;
        for _ in 0..depth {
            match value {
                Value::Array(values) => value = values.first()?,
                _ => return None,
            }
        }
        match value {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The reply's items, if it is a list.
    pub fn into_list(self) -> Option<Vec<Reply>> {
        match self.0 {
            Value::Array(values) => Some(values.into_iter().map(Reply).collect()),
            _ => None,
        }
    }

    /// A reader of the reply's items in order; `function` names who answered, for errors
    /// (e.g. "the queue's Redis function"). An error when the reply is not a list.
    pub fn reader(self, function: &'static str) -> Result<Reader, StoreError> {
        match self.0 {
            Value::Array(values) => Ok(Reader {
                values: values.into_iter(),
                function,
            }),
            other => Err(unexpected(function, "a reply that is not a list", &other)),
        }
    }
}

impl From<i64> for Reply {
    fn from(n: i64) -> Reply {
        Reply(Value::Int(n))
    }
}

impl From<&str> for Reply {
    fn from(text: &str) -> Reply {
        Reply(Value::BulkString(text.as_bytes().to_vec()))
    }
}

/// A protocol error: `function` answered `what` where the reader expected otherwise.
fn unexpected(function: &str, what: &str, value: &dyn std::fmt::Debug) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("{function} answered {what} unexpectedly: {value:?}"),
    )
}

/// A list reply's items, read in order; every read that finds something else than it
/// expects is a [`StoreErrorKind::Protocol`] error naming the function and the item.
#[derive(Debug)]
pub struct Reader {
    values: std::vec::IntoIter<Value>,
    function: &'static str,
}

impl Reader {
    /// Whether every item has been read.
    pub fn is_empty(&self) -> bool {
        self.values.len() == 0
    }

    /// The next item, whatever it is.
    pub fn item(&mut self) -> Result<Reply, StoreError> {
        self.values
            .next()
            .map(Reply)
            .ok_or_else(|| self.error("too few values", &"the end of the list"))
    }

    /// The next item, a number (an integer, or a string of one: Lua answers numbers beyond
    /// an integer's reach as text).
    pub fn int(&mut self) -> Result<i64, StoreError> {
        let text = match self.values.next() {
            Some(Value::Int(n)) => return Ok(n),
            Some(Value::BulkString(b)) => b,
            Some(Value::SimpleString(s)) => s.into_bytes(),
            other => return Err(self.error("a non-number", &other)),
        };
        std::str::from_utf8(&text)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| self.error("a non-number", &String::from_utf8_lossy(&text)))
    }

    /// The next item, a number of at least 0.
    pub fn u64(&mut self) -> Result<u64, StoreError> {
        let n = self.int()?;
        u64::try_from(n).map_err(|_| self.error("a negative number", &n))
    }

    /// The next item, a number that fits a `u32`.
    pub fn u32(&mut self) -> Result<u32, StoreError> {
        let n = self.int()?;
        u32::try_from(n).map_err(|_| self.error("a number out of range", &n))
    }

    /// The next item, a time in µs, or `None` for a negative number (the libraries' "none").
    pub fn time(&mut self) -> Result<Option<u64>, StoreError> {
        Ok(u64::try_from(self.int()?).ok())
    }

    /// The next item, bytes (a string; a number there is an error: a decoder that reads
    /// out of step is told at once).
    pub fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        match self.values.next() {
            Some(Value::BulkString(b)) => Ok(b),
            Some(Value::SimpleString(s)) => Ok(s.into_bytes()),
            other => Err(self.error("a non-string", &other)),
        }
    }

    /// The next item, UTF-8 text.
    pub fn text(&mut self) -> Result<String, StoreError> {
        let bytes = self.bytes()?;
        String::from_utf8(bytes).map_err(|e| self.error("text that is not UTF-8", &e))
    }

    fn error(&self, what: &str, value: &dyn std::fmt::Debug) -> StoreError {
        unexpected(self.function, what, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_names_the_function_and_what_it_found() {
        let mut r = Reply::list([Reply::from(-1), Reply::from("x")])
            .reader("the test's function")
            .unwrap();
        assert_eq!(r.time().unwrap(), None);
        let e = r.u64().unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Protocol);
        assert!(
            e.message()
                .starts_with("the test's function answered a non-number"),
            "{e}"
        );
        let e = r.int().unwrap_err();
        assert!(e.message().contains("a non-number"), "{e}");
    }

    #[test]
    fn numbers_read_from_integers_and_strings_and_refuse_the_out_of_range() {
        let mut r = Reply::list([
            Reply::from("42"),
            Reply::from(-3),
            Reply::from(i64::from(u32::MAX) + 1),
        ])
        .reader("f")
        .unwrap();
        assert_eq!(r.int().unwrap(), 42);
        assert!(r.u64().is_err());
        assert!(r.u32().is_err());
        assert!(r.is_empty());
        assert!(r.item().is_err());
    }

    #[test]
    fn a_reply_that_is_not_a_list_has_no_reader() {
        let e = Reply::from(5).reader("f").unwrap_err();
        assert!(e.message().contains("not a list"), "{e}");
        assert_eq!(Reply::from(5).int(), Some(5));
        assert_eq!(Reply::from("5").into_list(), None);
    }
}

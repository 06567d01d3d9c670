//! What the client's test files share.

use std::time::Duration;

use paceline_client::headers::Observation;

/// What a response said: bucket `b1`, `left` of 5 calls for a minute.
pub fn minute_of_five(left: u64) -> Observation {
    Observation {
        bucket: Some("b1".into()),
        limit: Some(5),
        remaining: Some(left),
        reset_after: Some(Duration::from_secs(60)),
        ..Observation::default()
    }
}

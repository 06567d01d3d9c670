//! Envoy's rate limit service (RLS v3) configured from envoyproxy/ratelimit's own YAML files:
//! the rules read and checked ([`RlsConfig`]), and what applies to each descriptor of a
//! request ([`match_request`]), both pure; and the service on top of [`Applies`]:
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC
//! (`--rls-listen`) and `POST /json` on the HTTP listener, both deciding alike.
//!
//! How the service decides a request:
//!
//! - **all or nothing**: every limit that applies (not in shadow mode) is decided in one
//!   atomic set of the store; a request over any limit counts on none, its statuses saying
//!   which limits refused (`OVER_LIMIT`) and which would have admitted (`OK`). A rule of 0
//!   requests, or a `hits_addend` more than a limit ever admits, refuses the request the
//!   same way. At most `paceline_store::MAX_LIMITS` limits per request;
//! - `hits_addend` 0 (a descriptor's own) checks without counting: `OVER_LIMIT` when the
//!   limit has nothing left;
//! - each counter's store key is `~rls:{DOMAIN}:SPEC:COUNTING_KEY`: the domain is a Redis
//!   Cluster hash tag, so **all of a domain's counters share one hash slot** (one primary
//!   of a cluster serves a domain); the canonical policy spec keeps two limits on one
//!   descriptor apart and leaves an unchanged rule's counter in place across a reload;
//! - `shadow_mode` limits are decided after the request, on their own (counted when the
//!   request is admitted, only checked when it is refused), and answer `OK` whatever they
//!   decide; one that would have refused is logged at INFO (target `paceline::rls`) and
//!   counted in `paceline_rls_shadow_mode_total`;
//! - every matched descriptor's hits count in its rule's metrics (`paceline_rls_hits_total`,
//!   `_over_limit_total`, `_near_limit_total`, `_within_limit_total`, `_shadow_mode_total`,
//!   labelled `rule`), at most [`RLS_RULE_LABELS`] ids holding a request's values, then
//!   [`OTHER_RULES`];
//! - a store failure follows the service's failure policy: `fail_open` and `local` answer
//!   as their fallback decides, `fail_closed` is gRPC `UNAVAILABLE` (`503` on `/json`);
//! - a status's `current_limit` is the rule's (or the request's) `requests_per_unit` per
//!   `unit`; a `policy:` rule has none (a paceline policy need not be a count per unit);
//!   `limit_remaining` and `duration_until_reset` are the decision's.
//!
//! The format, as envoyproxy/ratelimit reads it:
//!
//! - one `domain` per file; `--rls-config PATH` is a file or a folder of `.yaml`/`.yml`
//!   files read in the order of their names; a domain in two files is refused;
//! - `descriptors`, nested to any depth (at most [`MAX_DEPTH`] here), each with a `key`, an
//!   optional `value` (a trailing `*` makes it a prefix), an optional `rate_limit` (`unit`
//!   and `requests_per_unit`, or `unlimited: true`; `name`; `replaces: [{name}]`),
//!   `shadow_mode`, `detailed_metric`, `value_to_metric` (the request's value in the
//!   metrics name where the rule has a wildcard or no value) and `share_threshold` (every
//!   value a wildcard matches counted as one);
//! - paceline's extensions inside `rate_limit`: `policy: "SPEC"` (any paceline policy,
//!   instead of `unit`/`requests_per_unit`/`unlimited`) and `drain: true` (the rule's
//!   hits are charged: counted past the limit, never refused; see the `decide` module).
//!
//! Matching walks the tree entry by entry: an exact key and value first, then the first
//! wildcard written (in file order) whose prefix the value starts with, then the key with no
//! value; it stops where nothing matches, and a rule applies only to a request descriptor
//! that ends at the rule's depth. Each value is counted apart (a wildcard's too, unless it
//! has `share_threshold`), under a key built from the domain and the request's own entries.
//!
//! Where paceline reads a file more strictly than envoyproxy/ratelimit: a field unknown *at
//! its level* is refused (not only a name unknown anywhere), as are `requests_per_unit` with
//! `unlimited: true` and a second YAML document. Where it matches more exactly: a key and a
//! value are compared apart, so key `a_b` with value `c` is not key `a` with value `b_c`, and
//! a key ending in `*` with no value is a plain key, not a wildcard.
//!
//! ```
//! use paceline_server::rls::{match_request, Applies, RequestDescriptor, RlsConfig};
//! let config = RlsConfig::from_yaml("messaging.yaml", "
//! domain: messaging
//! descriptors:
//!   - key: message_type
//!     value: marketing
//!     descriptors:
//!       - key: to_number
//!         rate_limit: {unit: day, requests_per_unit: 5}
//!   - key: to_number
//!     rate_limit: {unit: day, requests_per_unit: 100}
//! ")?;
//! let marketing = RequestDescriptor {
//!     entries: vec![("message_type", "marketing"), ("to_number", "2061111111")],
//!     ..Default::default()
//! };
//! let any = RequestDescriptor { entries: vec![("to_number", "2061111111")], ..Default::default() };
//! let applies = match_request(&config, "messaging", 1, &[marketing, any]);
//! let Applies::Limit { matched, policy } = &applies[0] else { panic!("a limit") };
//! assert_eq!(policy.to_string(), "fixed_window:limit=5,window=1d");
//! assert_eq!(matched.rule_id, "messaging.message_type_marketing.to_number");
//! let Applies::Limit { policy, .. } = &applies[1] else { panic!("a limit") };
//! assert_eq!(policy.to_string(), "fixed_window:limit=100,window=1d");
//! # Ok::<(), paceline_server::rls::RlsConfigError>(())
//! ```

use crate::rls_rules::config;
pub(crate) mod decide;
pub(crate) mod incoming;
pub(crate) mod json;
use crate::rls_rules::matching;
pub(crate) mod service;

pub use crate::rls_rules::load;
pub use config::{
    Descriptor, Domain, Level, RateLimit, RlsConfig, RlsConfigError, RuleLimit, Unit, UnitLimit,
    MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES,
};
pub use matching::{counting_key, match_request, Applies, Matched, RequestDescriptor};

pub use crate::metrics::{OTHER_RULES, RLS_RULE_LABELS};

//! How a layer decides a request: each limit's key in the store, the set of requests, the
//! wait of pace mode, the headers of an admission, the `429` of a refusal, and the leases an
//! admission holds until its response is over.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use http::{header, StatusCode};
use paceline_core::{Decision, Error, Op, Policy};
use paceline_store::{Request, SetDecision};
use tower_service::Service;

use super::body::LimitedBody;
use super::{Limit, Shared, StoreFailure};
use crate::headers::{self, Names, Problem, PROBLEM_JSON};
use crate::key::{Head, KeyText};

/// In pace mode, how often a request waiting for a place in flight asks for one (a lease
/// may come back before its expiry).
const LEASE_POLL: Duration = Duration::from_millis(50);

/// What a request is decided under: each limit's key in the store, and the policy each
/// limit choosing per request chose.
pub(super) struct StoreKeys {
    pub(super) keys: Keys,
    /// For each limit, the index of the policy it chose among its own (0 for a limit of one
    /// policy); `None` when no limit of the layer chooses.
    chosen: Option<Vec<usize>>,
}

/// Each limit's key in the store, `{KEY}:NAME` (`{KEY}:NAME:POLICY` for a policy chosen
/// per request): for one limit, one key on the stack (no allocation while it is short, no
/// vector).
pub(super) enum Keys {
    One(KeyText),
    Many(Vec<String>),
}

impl StoreKeys {
    fn len(&self) -> usize {
        match &self.keys {
            Keys::One(_) => 1,
            Keys::Many(keys) => keys.len(),
        }
    }

    fn get(&self, i: usize) -> Option<&str> {
        match &self.keys {
            Keys::One(key) => (i == 0).then(|| key.as_str()),
            Keys::Many(keys) => keys.get(i).map(String::as_str),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

/// An admission decided in `call`: one limit's decision (the combined decision is that
/// limit's own), or a set's.
pub(super) enum Decided {
    One(Decision),
    Set(SetDecision),
}

impl Decided {
    pub(super) fn allowed(&self) -> bool {
        self.combined().allowed
    }

    pub(super) fn combined(&self) -> &Decision {
        match self {
            Decided::One(d) => d,
            Decided::Set(set) => &set.decision,
        }
    }

    pub(super) fn limits(&self) -> &[Decision] {
        match self {
            Decided::One(d) => std::slice::from_ref(d),
            Decided::Set(set) => &set.limits,
        }
    }

    pub(super) fn into_set(self) -> SetDecision {
        match self {
            Decided::One(d) => SetDecision::new(d.allowed, vec![d]),
            Decided::Set(set) => set,
        }
    }
}

impl Shared {
    /// Each limit's key in the store for a request, `{KEY}:NAME` (the key a hash tag;
    /// `{KEY}:NAME:POLICY` for a policy chosen per request), and the policies chosen; the
    /// problem to answer when a key cannot be read or a choice names no policy.
    pub(super) fn store_keys(&self, head: &Head<'_>) -> Result<StoreKeys, Problem> {
        let mut chosen = self.chooses.then(|| vec![0; self.limits.len()]);
        let mut key = |i: usize, limit: &Limit| {
            let mut key = KeyText::new();
            key.push_str("{");
            let mut policy = None;
            let mut given = None;
            if let Some(chooser) = &limit.chooser {
                let (index, given_key) = chooser.pick(head).map_err(|name| {
                    Problem::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!(
                            "the `{}` limit chose `{name}`, which is none of its policies ({})",
                            limit.name,
                            chooser.names()
                        ),
                    )
                })?;
                if let Some(slot) = chosen.as_mut().and_then(|c| c.get_mut(i)) {
                    *slot = index;
                }
                policy = chooser.policies.get(index).map(|(name, _)| name.as_str());
                given = given_key;
            }
            match given {
                Some(given) => key.push_str(&given),
                None => limit.key.read_into(head, &mut key).map_err(|missing| {
                    let status = if missing.request_fault {
                        StatusCode::BAD_REQUEST
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    };
                    Problem::new(
                        status,
                        format!("the `{}` limit has no key: {}", limit.name, missing.what),
                    )
                })?,
            }
            key.push_str("}:");
            key.push_str(&limit.name);
            if let Some(policy) = policy {
                key.push_str(":");
                key.push_str(policy);
            }
            Ok(key)
        };
        let keys = match self.limits.as_slice() {
            [one] => Keys::One(key(0, one)?),
            several => Keys::Many(
                several
                    .iter()
                    .enumerate()
                    .map(|(i, limit)| key(i, limit).map(KeyText::into_string))
                    .collect::<Result<_, _>>()?,
            ),
        };
        Ok(StoreKeys { keys, chosen })
    }

    /// The policy limit `i` applies to the request of `keys`: its own, or the one it chose.
    pub(super) fn policy(&self, i: usize, keys: &StoreKeys) -> Option<&Policy> {
        let limit = self.limits.get(i)?;
        match (&limit.chooser, &keys.chosen) {
            (Some(chooser), Some(chosen)) => {
                let index = *chosen.get(i)?;
                chooser.policies.get(index).map(|(_, p)| p)
            }
            _ => Some(&limit.policy),
        }
    }

    /// `RateLimit-Policy` of the request of `keys`: the same for every answer, or written
    /// for this one when a limit chose its policy.
    fn policy_header(&self, keys: &StoreKeys) -> Option<http::HeaderValue> {
        if !self.chooses {
            return self.policy_header.clone();
        }
        let quotas: Vec<(&str, u64)> = (0..self.limits.len())
            .filter_map(|i| {
                let limit = self.limits.get(i)?;
                Some((limit.name.as_str(), self.policy(i, keys)?.limit()))
            })
            .collect();
        headers::policy_field(&quotas)
    }

    /// The op every request asks its limits: a reservation in pace mode if they book
    /// ahead, else `limit`.
    pub(super) fn op(&self) -> Op {
        match self.pace {
            Some(max_wait) if self.reserves => Op::pace_within(max_wait),
            _ => Op::Limit,
        }
    }

    /// The requests of `op` for each limit's key.
    pub(super) fn requests<'a>(&'a self, keys: &'a StoreKeys, op: Op) -> Vec<Request<'a>> {
        self.limits
            .iter()
            .zip(keys.iter())
            .enumerate()
            .map(|(i, (limit, key))| {
                let policy = self.policy(i, keys).unwrap_or(&limit.policy);
                Request::new(policy, key, op, 1)
            })
            .collect()
    }

    /// The leases an admission took (`limits`: each limit's decision), held until dropped
    /// (none: `None`).
    pub(super) fn guard(
        self: &Arc<Self>,
        limits: &[Decision],
        keys: &StoreKeys,
    ) -> Option<LeaseGuard> {
        if limits.iter().all(|d| d.lease.is_none()) {
            return None;
        }
        let leases: Vec<(Policy, String, u64)> = limits
            .iter()
            .zip(keys.iter())
            .enumerate()
            .filter_map(|(i, (d, key))| {
                let policy = self.policy(i, keys)?.clone();
                d.lease.map(|id| (policy, key.to_string(), id))
            })
            .collect();
        Some(LeaseGuard {
            shared: Arc::clone(self),
            leases,
        })
    }

    /// Decides (after `first`, the outcome of a decision made already, if any), waits as
    /// pace mode says, then calls the inner service.
    pub(super) async fn run<S, B, R>(
        shared: Arc<Shared>,
        mut inner: S,
        request: http::Request<B>,
        keys: StoreKeys,
        mut first: Option<(Result<SetDecision, Error>, Option<LeaseGuard>)>,
    ) -> Result<http::Response<LimitedBody<R>>, S::Error>
    where
        S: Service<http::Request<B>, Response = http::Response<R>>,
    {
        let store_keys = keys;
        let reserves = shared.reserves;
        let op = shared.op();
        let mut waited = Duration::ZERO;
        let mut held = None;
        let set = loop {
            let decided = match (first.take(), shared.limits.as_slice(), &store_keys.keys) {
                (Some((outcome, guard)), _, _) => {
                    held = guard;
                    outcome
                }
                // One limit (the common case): no vector of requests.
                (None, [limit], Keys::One(key)) => {
                    let policy = shared.policy(0, &store_keys).unwrap_or(&limit.policy);
                    let request = Request::new(policy, key.as_str(), op, 1);
                    shared
                        .store
                        .decide_all(std::slice::from_ref(&request))
                        .await
                }
                (None, _, _) => {
                    let requests = shared.requests(&store_keys, op);
                    shared.store.decide_all(&requests).await
                }
            };
            match decided {
                Ok(set) if set.allowed() => break set,
                Ok(set) => {
                    // Pace mode without a reservation: wait for the longest retry-after
                    // while the budget lasts, then ask again; a place in flight may come
                    // back before its lease's expiry, so it is asked for every
                    // `LEASE_POLL` meanwhile.
                    let Some(max_wait) = shared.pace.filter(|_| !reserves) else {
                        return Ok(shared.refusal(&set, &store_keys));
                    };
                    let budget = max_wait.saturating_sub(waited);
                    let in_flight = set.refused().any(|i| {
                        matches!(shared.policy(i, &store_keys), Some(Policy::Concurrency(_)))
                    });
                    let retry = set.decision.delay;
                    let step = if in_flight {
                        retry.min(LEASE_POLL).min(budget)
                    } else {
                        retry
                    };
                    if step.is_zero() || step > budget {
                        return Ok(shared.refusal(&set, &store_keys));
                    }
                    shared.store.sleep(step).await;
                    waited = waited.saturating_add(step);
                }
                Err(Error::Store(_)) if shared.on_failure == StoreFailure::Allow => {
                    let response = inner.call(request).await?;
                    return Ok(response.map(|body| LimitedBody::inner(body, None)));
                }
                Err(e) => {
                    let status = match e {
                        Error::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
                        _ => StatusCode::INTERNAL_SERVER_ERROR,
                    };
                    let problem =
                        Problem::new(status, format!("the limits could not be decided: {e}"));
                    return Ok(answer(&problem));
                }
            }
        };
        // Held from here (or from `call`): a request dropped while it waits for its slot
        // gives its leases back too.
        let guard = match held {
            Some(guard) => Some(guard),
            None => shared.guard(&set.limits, &store_keys),
        };
        if !set.decision.delay.is_zero() {
            shared.store.sleep(set.decision.delay).await;
        }
        // On an error the guard is dropped here, giving the leases back.
        let mut response = inner.call(request).await?;
        if shared.headers {
            shared.insert_headers(
                response.headers_mut(),
                &set.limits,
                &set.decision,
                &store_keys,
            );
        }
        Ok(response.map(|body| LimitedBody::inner(body, guard)))
    }

    /// An admission's `RateLimit-Policy` and `RateLimit` (`limits`: each limit's decision,
    /// for the request of `keys`), none if the layer sends no headers.
    pub(super) fn admitted_fields(
        &self,
        limits: &[Decision],
        keys: &StoreKeys,
    ) -> (Option<http::HeaderValue>, Option<http::HeaderValue>) {
        if !self.headers {
            return (None, None);
        }
        let names = self.limits.iter().map(|l| l.quoted.as_str());
        let state = headers::state_field(names.zip(limits), Names::Quoted);
        (self.policy_header(keys), state)
    }

    /// Adds `RateLimit-Policy` (the same for every answer, written once and copied, unless
    /// a limit chose its policy for the request of `keys`) and `RateLimit` of `limits`,
    /// each limit's decision, and `combined`.
    fn insert_headers(
        &self,
        headers: &mut http::HeaderMap,
        limits: &[Decision],
        combined: &Decision,
        keys: &StoreKeys,
    ) {
        if let Some(policy) = self.policy_header(keys) {
            headers.insert(headers::RATELIMIT_POLICY, policy);
        }
        let names = self.limits.iter().map(|l| l.quoted.as_str());
        headers::insert_state_of(headers, names.zip(limits), Names::Quoted, combined);
    }

    /// The `429` of a refused set, for the request of `keys`.
    pub(super) fn refusal<R>(
        &self,
        set: &SetDecision,
        keys: &StoreKeys,
    ) -> http::Response<LimitedBody<R>> {
        let violated = set
            .refused()
            .filter_map(|i| self.limits.get(i).map(|l| l.name.clone()))
            .collect();
        let delay = set.retry_after().unwrap_or_default();
        let mut response = answer(&Problem::too_many_requests(violated, delay));
        if self.headers {
            self.insert_headers(response.headers_mut(), &set.limits, &set.decision, keys);
        } else {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                headers::seconds_up(delay).max(1).into(),
            );
        }
        response
    }
}

/// An answer of the layer's own: `problem` as `application/problem+json`.
pub(super) fn answer<R>(problem: &Problem) -> http::Response<LimitedBody<R>> {
    let mut response = http::Response::new(LimitedBody::answer(problem.to_bytes()));
    *response.status_mut() =
        StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, PROBLEM_JSON);
    response
}

/// The leases a request holds, given back when dropped: with its response body (ended, or
/// dropped when the client went away), or with the request if it never got that far.
pub(super) struct LeaseGuard {
    pub(super) shared: Arc<Shared>,
    /// Each lease: its limit's policy (the one chosen, for a limit choosing per request),
    /// its key in the store, its id.
    pub(super) leases: Vec<(Policy, String, u64)>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        for (policy, key, id) in std::mem::take(&mut self.leases) {
            // The memory store gives it back here, at once; a remote store in a task of
            // the runtime (without one, the lease is reclaimed at its expiry).
            if !self.shared.store.is_remote() {
                let mut release = self.shared.store.release(&policy, &key, id);
                let mut cx = Context::from_waker(Waker::noop());
                if Pin::new(&mut release).poll(&mut cx).is_ready() {
                    continue;
                }
            }
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let shared = Arc::clone(&self.shared);
                runtime.spawn(async move {
                    // A failed release leaves the lease to be reclaimed at its expiry.
                    let _ = shared.store.release(&policy, &key, id).await;
                });
            }
        }
    }
}

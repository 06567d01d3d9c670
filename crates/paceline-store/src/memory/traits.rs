//! The memory store as a [`Store`] and a [`SyncStore`]: every answer ready at once.

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, Decision, Error, Op, Policy, Sleep};

use super::{MemoryStore, StoreClock};
use crate::{Request, SetDecision, Store, StoreFuture, SyncStore};

impl Store for MemoryStore {
    fn decide<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        op: Op,
        cost: u64,
    ) -> StoreFuture<'a, Result<Decision, Error>> {
        StoreFuture::ready(self.decide_now(policy, key, op, cost))
    }

    fn decide_batch<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> StoreFuture<'a, Vec<Result<Decision, Error>>> {
        StoreFuture::ready(
            requests
                .iter()
                .map(|r| self.decide_now(r.policy, r.key, r.op, r.cost))
                .collect(),
        )
    }

    fn decide_all<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> StoreFuture<'a, Result<SetDecision, Error>> {
        StoreFuture::ready(self.decide_all_now(requests))
    }

    fn release<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        lease: u64,
    ) -> StoreFuture<'a, Result<bool, Error>> {
        StoreFuture::ready(self.release_sync(policy, key, lease))
    }

    fn extend<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        lease: u64,
    ) -> StoreFuture<'a, Result<Option<Duration>, Error>> {
        StoreFuture::ready(self.extend_sync(policy, key, lease))
    }

    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<(), Error>> {
        self.reset_now(key);
        StoreFuture::ready(Ok(()))
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.clock().sleep(duration)
    }

    fn as_sync(&self) -> Option<&dyn SyncStore> {
        Some(self)
    }

    fn time_source(&self) -> Option<Arc<dyn Clock>> {
        Some(match &self.clock {
            StoreClock::System(clock) => Arc::new(clock.clone()),
            StoreClock::Injected(clock) => Arc::clone(clock),
        })
    }
}

impl SyncStore for MemoryStore {
    #[inline]
    fn decide_sync(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.decide_now(policy, key, op, cost)
    }

    fn decide_all_sync(&self, requests: &[Request<'_>]) -> Result<SetDecision, Error> {
        self.decide_all_now(requests)
    }

    fn release_sync(&self, policy: &Policy, key: &str, lease: u64) -> Result<bool, Error> {
        self.lease_now(policy, key, lease, false)
    }

    fn extend_sync(
        &self,
        policy: &Policy,
        key: &str,
        lease: u64,
    ) -> Result<Option<Duration>, Error> {
        let live = self.lease_now(policy, key, lease, true)?;
        Ok(live.then(|| policy.concurrency().map(|c| c.lease()).unwrap_or_default()))
    }

    fn reset_sync(&self, key: &str) -> Result<(), Error> {
        self.reset_now(key);
        Ok(())
    }
}
